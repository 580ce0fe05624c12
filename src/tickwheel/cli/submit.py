"""``tickwheel submit``: rows to a running service, over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from tickwheel.cli._app import app, console, plural, print_error


@app.command()
def submit(
    url: Annotated[str, typer.Argument(help="the service's address, as --listen printed it "
                                            "(http://127.0.0.1:PORT)")],
    files: Annotated[list[Path] | None, typer.Argument(
        help="JSON Lines files of the log's rows (watch, update, cancel, tick, and "
             "schedule, unschedule, pause, resume); - or none: standard input")] = None,
    batch_rows: Annotated[int, typer.Option(
        min=1, max=100_000, help="rows per request")] = 1_000,
    idempotency_key: Annotated[str | None, typer.Option(
        help="a key for this submission: request N carries KEY-N, so running the same "
             "command again writes nothing twice (default: a fresh one, printed)")] = None,
    retries: Annotated[int, typer.Option(
        min=0, max=100, help="attempts after congestion or no answer, with backoff")] = 8,
    token_file: Annotated[Path | None, typer.Option(
        help="the service's token (its --token-file), sent as Authorization: Bearer")
    ] = None,
) -> None:
    """Send rows to a following service's submit API (tickwheel run --follow --listen):
    each request is answered only once its rows are on disk."""
    try:
        from tickwheel.client import Client, RowsRefused, SubmitError
        from tickwheel.service.webhook import check_webhook_url

        check_webhook_url(url)
    except ImportError as exc:
        print_error("submit needs the service extra: pip install 'tickwheel[service]'")
        raise typer.Exit(2) from exc
    except ValueError as exc:
        print_error(f"URL: {exc}")
        raise typer.Exit(2) from exc
    token = None
    if token_file is not None:
        from tickwheel.service.auth import TokenError, read_token

        try:
            token = read_token(token_file)
        except TokenError as exc:
            print_error(f"--token-file {exc}")
            raise typer.Exit(2) from exc
    sources = files or [Path("-")]
    for path in sources:
        if str(path) != "-" and not path.is_file():
            print_error(f"{path}: no such file")
            raise typer.Exit(2)
    run_key = idempotency_key or f"submit-{int(time.time() * 1000)}-{os.getpid()}"
    sent = batches = 0
    with Client(url, retries=retries, token=token) as client:
        try:
            for rows in _row_batches(sources, batch_rows):
                accepted = client.submit_lines(rows, idempotency_key=f"{run_key}-{batches}")
                sent += accepted.accepted
                batches += 1
        except RowsRefused as exc:
            for row in exc.refused[:20]:
                print_error(f"request {batches}, row {row.index}: {row.reason}: {row.row}")
            print_error(f"request {batches} refused ({exc}); the requests before it took "
                   f"{sent:,} rows; run again with --idempotency-key {run_key} once fixed")
            raise typer.Exit(1) from exc
        except SubmitError as exc:
            if exc.status == 422:  # the same key again can never succeed
                advice = (f"key {run_key}-{batches} holds other rows, so the input differs "
                          "from the run that used it: send the rows not yet taken with a "
                          "new --idempotency-key")
            elif exc.status is not None and exc.status < 500 and exc.status != 429:
                advice = "nothing of it is written: fix what the server names and run again"
            else:
                advice = f"run again with --idempotency-key {run_key}"
            print_error(f"request {batches}: {exc}; the requests before it took {sent:,} "
                        f"rows; {advice}")
            raise typer.Exit(1) from exc
        except (OSError, ValueError) as exc:
            print_error(f"request {batches}: {exc}; the requests before it took {sent:,} "
                        f"rows; run again with --idempotency-key {run_key}")
            raise typer.Exit(1) from exc
    console.print(f"{sent:,} rows taken in {plural(batches, 'request')} "
                  f"(idempotency key {run_key})")


def _row_batches(sources: list[Path], size: int) -> Iterator[list[str]]:
    """Rows of JSON Lines files (or standard input) as their text, unchanged, ``size``
    at a time; ValueError naming the file and line of one that is not a JSON object.
    Parsed only to check that: the service judges the text as written (a field named
    twice, say, is refused there rather than resolved here)."""
    batch: list[str] = []
    for path in sources:
        stream = sys.stdin if str(path) == "-" else path.open(encoding="utf-8-sig")
        with contextlib.nullcontext(stream) if stream is sys.stdin else stream:
            for number, line in enumerate(stream, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError):
                    row = None
                if not isinstance(row, dict):
                    raise ValueError(f"{path}:{number}: not a JSON object: {line[:200]!r}")
                batch.append(line.strip())
                if len(batch) >= size:
                    yield batch
                    batch = []
    if batch:
        yield batch
