"""``tickwheel schedules``: manage a running service's schedules over HTTP."""

from __future__ import annotations

import enum
import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from zoneinfo import ZoneInfo

import typer
from rich.table import Table

from tickwheel.cli._app import app, console, print_error, read_one, service_client

if TYPE_CHECKING:
    from tickwheel.client import Client

__all__ = ["format_time", "schedules"]

schedules = typer.Typer(help="Manage a running service's schedules (tickwheel serve).",
                        no_args_is_help=True)
app.add_typer(schedules, name="schedules")

_Url = Annotated[str, typer.Argument(help="the service's address (http://127.0.0.1:8470)")]
_Id = Annotated[str, typer.Argument(metavar="ID", help="the schedule's id")]
MAX_PAGE = 1_000  # the API's largest page


class _State(enum.Enum):
    running = "running"
    paused = "paused"


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
    from tickwheel.client import RowsRefused, SubmitError

    row = {"type": kind, "schedule_id": schedule_id, **(fields or {})}
    with service_client(url, token_file) as client:
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


@schedules.command("list")
def list_(url: _Url,
          prefix: Annotated[str, typer.Option(help="only ids that start with this")] = "",
          state: Annotated[_State | None, typer.Option(help="only running or paused ones")
                           ] = None,
          limit: Annotated[int, typer.Option(min=1, max=100_000,
                                             help="schedules to show, at most")] = 100,
          json_out: Annotated[bool, typer.Option("--json", help="JSON Lines, for programs")
                              ] = False,
          token_file: _TokenFile = None) -> None:
    """The service's schedules in id order: spec, next fire (in its zone and in UTC),
    runs."""
    with service_client(url, token_file) as client:
        found, more, as_of = _walk(client, prefix, None if state is None else state.value,
                                   limit)
    if json_out:
        for item in found:
            print(json.dumps(item))
        return
    table = Table(title=f"{len(found):,} schedule{'s' if len(found) != 1 else ''}"
                        f"{' (more: raise --limit)' if more else ''}, as of {format_time(as_of)}")
    table.add_column("id", overflow="fold", min_width=12)
    table.add_column("state")
    table.add_column("schedule", overflow="fold", min_width=16)
    table.add_column("next fire (its zone, UTC)", no_wrap=True)  # times stay whole
    table.add_column("runs (skipped)", justify="right")
    table.add_column("last fired (UTC)", no_wrap=True)
    for item in found:
        zone = item["spec"].get("tz", "UTC")
        next_fire = format_time(item["next_fire_ms"], zone)
        if zone != "UTC" and item["next_fire_ms"] is not None:
            next_fire += "\n" + format_time(item["next_fire_ms"])
        runs = f"{item['runs']:,}" + (f" ({item['skipped']:,})" if item["skipped"] else "")
        table.add_row(item["schedule_id"], item["state"], item.get("summary", ""), next_fire,
                      runs, format_time(item["last_fired_ms"]))
    console.print(table)


@schedules.command()
def show(url: _Url, schedule_id: _Id,
         json_out: Annotated[bool, typer.Option("--json", help="JSON, for programs")] = False,
         token_file: _TokenFile = None) -> None:
    """One schedule: its spec, state, runs and next five fire times."""
    found = read_one(url, token_file, f"no schedule {schedule_id!r}",
                     lambda client: client.get_schedule(schedule_id))
    if json_out:
        print(json.dumps(found))
        return
    zone = found["spec"].get("tz", "UTC")
    console.print(f"{found['schedule_id']}: {found.get('summary', '')} ({found['state']})")
    console.print(f"  spec         {json.dumps(found['spec'])}")
    console.print(f"  runs         {found['runs']:,} ({found['skipped']:,} skipped since the "
                  "last fire)")
    console.print(f"  last fired   {format_time(found['last_fired_ms'])}")
    for n, fire in enumerate(found.get("upcoming") or []):
        label = "upcoming" if n == 0 else ""
        console.print(f"  {label:<12} {format_time(fire, zone)}  ({format_time(fire)})")
    if not found.get("upcoming"):
        console.print("  upcoming     none" + (" while paused" if found["state"] == "paused"
                                               else ""))
    console.print(f"  as of        {format_time(found.get('as_of_ms'))}")


def _walk(client: Client, prefix: str, state: str | None, limit: int,
          ) -> tuple[list[dict[str, Any]], bool, int | None]:
    """Up to ``limit`` schedules, page after page; whether more remain; as of when."""
    from tickwheel.client import SubmitError

    found: list[dict[str, Any]] = []
    cursor = None
    as_of = None
    try:
        while True:
            page = client.list_schedules(prefix=prefix, state=state, cursor=cursor,
                                         limit=min(MAX_PAGE, limit - len(found) + 1))
            as_of = page.get("as_of_ms")
            found += page["schedules"]
            cursor = page.get("next_cursor")
            if len(found) > limit:
                return found[:limit], True, as_of
            if cursor is None:
                return found, False, as_of
    except (SubmitError, OSError) as exc:
        print_error(f"{client.url}: {exc}")
        raise typer.Exit(1) from exc


def format_time(ms: int | None, zone: str = "UTC") -> str:
    """``ms`` in ``zone``, to the second (milliseconds where there are any)."""
    if ms is None:
        return "-"
    try:
        when = datetime.fromtimestamp(ms / 1000, ZoneInfo(zone))
    except (OverflowError, ValueError, OSError, KeyError):
        return f"{ms} ms"
    text = when.strftime("%Y-%m-%d %H:%M:%S")
    if ms % 1000:
        text += f".{ms % 1000:03d}"
    return f"{text} {when.tzname() if zone != 'UTC' else 'UTC'}"
