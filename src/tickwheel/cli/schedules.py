"""``tickwheel schedules``: manage a running service's schedules over HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from tickwheel.cli._app import app, console, print_error

__all__ = ["schedules"]

schedules = typer.Typer(help="Manage a running service's schedules (tickwheel serve).",
                        no_args_is_help=True)
app.add_typer(schedules, name="schedules")

_Url = Annotated[str, typer.Argument(help="the service's address (http://127.0.0.1:8470)")]
_Id = Annotated[str, typer.Argument(metavar="ID", help="the schedule's id")]
_TokenFile = Annotated[Path | None, typer.Option(
    help="the service's token (its --token-file)")]


@schedules.command()
def put(url: _Url, schedule_id: _Id,
        spec: Annotated[str, typer.Argument(
            help='the schedule\'s fields as JSON: \'{"cron": "0 * * * *", "tz": '
                 '"Europe/London"}\' or \'{"every_ms": 60000}\'')],
        token_file: _TokenFile = None) -> None:
    """Start a schedule, or replace its spec from now on."""
    try:
        fields = json.loads(spec)
    except ValueError as exc:
        print_error(f"SPEC is not JSON: {exc}")
        raise typer.Exit(2) from exc
    if not isinstance(fields, dict):
        print_error("SPEC must be a JSON object of the schedule's fields")
        raise typer.Exit(2)
    _act(url, token_file, "schedule", schedule_id, fields)


@schedules.command()
def pause(url: _Url, schedule_id: _Id, token_file: _TokenFile = None) -> None:
    """Pause a schedule: its occurrences do not fire until it is resumed."""
    _act(url, token_file, "pause", schedule_id)


@schedules.command()
def resume(url: _Url, schedule_id: _Id, token_file: _TokenFile = None) -> None:
    """Resume a paused schedule; its misfire policy decides the occurrences missed."""
    _act(url, token_file, "resume", schedule_id)


@schedules.command()
def delete(url: _Url, schedule_id: _Id, token_file: _TokenFile = None) -> None:
    """End a schedule."""
    _act(url, token_file, "unschedule", schedule_id)


def _act(url: str, token_file: Path | None, kind: str, schedule_id: str,
         fields: dict[str, Any] | None = None) -> None:
    """One management request; exit 2 for what is wrong here, 1 for a refusal."""
    try:
        from tickwheel.client import Client, RowsRefused, SubmitError
        from tickwheel.service.auth import TokenError, read_token
        from tickwheel.service.webhook import check_webhook_url

        check_webhook_url(url)
        token = None if token_file is None else read_token(token_file)
    except ImportError as exc:
        print_error("this needs the service extra: pip install 'tickwheel[service]'")
        raise typer.Exit(2) from exc
    except TokenError as exc:
        print_error(f"--token-file {exc}")
        raise typer.Exit(2) from exc
    except ValueError as exc:
        print_error(f"URL: {exc}")
        raise typer.Exit(2) from exc
    row = {"type": kind, "schedule_id": schedule_id, **(fields or {})}
    with Client(url, token=token) as client:
        try:
            client.submit(row)
        except RowsRefused as exc:
            reasons = ", ".join(r.reason for r in exc.refused)
            print_error(f"{kind} {schedule_id!r} refused: {reasons} ({exc})")
            raise typer.Exit(1) from exc
        except (SubmitError, OSError) as exc:
            print_error(f"{kind} {schedule_id!r}: {exc}")
            raise typer.Exit(1) from exc
    console.print(f"{kind} {schedule_id}: taken")
