"""``tickwheel redeliver``: send a target's dead letters again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tickwheel.cli._app import app, console, print_error

__all__ = ["redeliver"]


@app.command()
def redeliver(
    output: Annotated[Path, typer.Argument(
        help="the run's output directory (its dead letters are in OUTPUT/dead-letter/)")],
    target: Annotated[str, typer.Option(
        help="the target whose dead letters are sent again")],
    targets: Annotated[Path | None, typer.Option(
        "--targets", metavar="FILE",
        help="the targets file that defines it: its urls, headers and signing key "
             "(without it, each request goes to the url its dead letter names, unsigned)"
    )] = None,
    to: Annotated[str | None, typer.Option(
        metavar="URL", help="send them to this URL instead, unsigned")] = None,
) -> None:
    """Send the requests in OUTPUT/dead-letter/TARGET/ again, each with its outcomes'
    ids and its webhook-id unchanged (so a receiver drops what it already has), and
    remove each one the target takes (2xx). Exit 1 if some are left."""
    try:
        from tickwheel.pipeline.io.files import read_bytes_nofollow
        from tickwheel.pipeline.io.outputs import DEAD_LETTERS
        from tickwheel.service.targets import TargetsError, load_targets, target_for_url
        from tickwheel.service.webhook import WebhookProcessor, message_id
    except ImportError as exc:
        print_error("redeliver needs the service extra: pip install 'tickwheel[service]'")
        raise typer.Exit(2) from exc
    from tickwheel.pipeline.contract.events import TARGET_NAME

    if TARGET_NAME.fullmatch(target) is None:
        print_error(f"--target {target!r} is not a target's name (letters, digits, '_', "
                    "'.' and '-', at most 64, not starting with '.' or '-')")
        raise typer.Exit(2)
    if targets is not None and to is not None:
        print_error("give --targets FILE or --to URL, not both")
        raise typer.Exit(2)
    spec = None  # None: the url each dead letter names
    try:
        if to is not None:
            spec = target_for_url(to, target)
        elif targets is not None:
            defined = load_targets(targets)
            if target not in defined:
                raise TargetsError(f"{targets} defines no target {target!r} (it defines "
                                   f"{', '.join(sorted(defined))})")
            spec = defined[target]
    except (TargetsError, ValueError) as exc:
        print_error(f"{'--to' if to is not None else '--targets'} {exc}")
        raise typer.Exit(2) from exc
    letters_dir = output / DEAD_LETTERS / target
    if letters_dir.is_symlink() or not letters_dir.is_dir():
        print_error(f"--target {target}: no dead letters in {letters_dir}")
        raise typer.Exit(2)
    letters = sorted(p for p in letters_dir.iterdir()
                     if p.suffix == ".json" and not p.name.startswith("."))
    webhooks: dict[str, WebhookProcessor] = {}
    sent = kept = outcomes = 0
    try:
        for path in letters:
            try:
                record = json.loads(read_bytes_nofollow(path))
                request = record["request"]
                ids = [str(o["id"]) for o in request["outcomes"]]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                print_error(f"{path.name}: not a dead letter tickwheel wrote ({exc}): kept")
                kept += 1
                continue
            url = record.get("url")
            if spec is None and not isinstance(url, str):
                print_error(f"{path.name}: it names no url (no targets file defines its "
                            "target): give --targets or --to; kept")
                kept += 1
                continue
            try:
                chosen = spec or target_for_url(str(url), target)
            except ValueError as exc:
                print_error(f"{path.name}: {exc}; kept")
                kept += 1
                continue
            webhook = webhooks.get(chosen.urls[0])
            if webhook is None:
                webhook = webhooks[chosen.urls[0]] = WebhookProcessor(chosen, letters_dir)
            msg_id = record.get("webhook_id") or message_id(ids)
            body = json.dumps(request, ensure_ascii=False).encode()
            status, answer = webhook.send(msg_id, body)
            if status is not None and 200 <= status < 300:
                path.unlink(missing_ok=True)
                sent += 1
                outcomes += len(ids)
            else:
                print_error(f"{path.name}: {status or answer} from {webhook.url}: kept")
                kept += 1
    finally:
        for webhook in webhooks.values():
            webhook.close()
    console.print(f"redelivered {sent:,} requests ({outcomes:,} outcomes) to {target}; "
                  f"{kept:,} kept in {letters_dir}")
    if kept:
        raise typer.Exit(1)
