"""``tickwheel ops``: look up a running service's operations over HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tickwheel.cli._app import app, console, read_one
from tickwheel.cli.schedules import format_time

__all__ = ["ops"]

ops = typer.Typer(help="Look up a running service's operations (tickwheel serve).",
                  no_args_is_help=True)
app.add_typer(ops, name="ops")


@ops.command()
def show(url: Annotated[str, typer.Argument(
             help="the service's address (http://127.0.0.1:8470)")],
         op_id: Annotated[str, typer.Argument(metavar="OP_ID", help="the operation's id")],
         json_out: Annotated[bool, typer.Option("--json", help="JSON, for programs")] = False,
         token_file: Annotated[Path | None, typer.Option(
             help="the service's token (its --token-file)")] = None) -> None:
    """One operation: pending (its deadline, keys and condition) or resolved (its
    outcome), while the service remembers its id."""
    found = read_one(url, token_file, f"no operation {op_id!r} pending or remembered",
                     lambda client: client.get_operation(op_id))
    if json_out:
        print(json.dumps(found))
        return
    console.print(f"{found['op_id']}: {found['state']}")
    if found["state"] == "pending":
        console.print(f"  deadline     {format_time(found['deadline_ms'])}")
        console.print(f"  watched at   {format_time(found['watched_ms'])}")
        console.print(f"  condition    {found['condition']}")
        console.print(f"  keys         {', '.join(found['keys']) or '-'}")
    else:
        console.print(f"  outcome      {found['outcome']}")
        console.print(f"  resolved at  {format_time(found['resolved_ms'])}")
    console.print(f"  as of        {format_time(found.get('as_of_ms'))}")
