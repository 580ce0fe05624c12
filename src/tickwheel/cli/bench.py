"""``tickwheel bench``: the benchmarks."""

from __future__ import annotations

from typing import Annotated

import typer

from tickwheel.bench import BENCHMARKS
from tickwheel.cli._app import app, console, print_error


# Its own --help too goes to the benchmark (`tickwheel bench timers --help`).
@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                               "help_option_names": []})
def bench(
    ctx: typer.Context,
    what: Annotated[str | None, typer.Argument(
        help="which benchmark: " + ", ".join(BENCHMARKS))] = None,
) -> None:
    """Run a benchmark; options after its name go to it (see `tickwheel bench WHAT --help`)."""
    from tickwheel.bench.__main__ import main as bench_main

    targets = BENCHMARKS
    if what not in targets:
        asked = what in ("--help", "-h")
        if not asked:
            print_error(f"which benchmark? one of {', '.join(targets)}"
                   f"{'' if what is None else f', not {what!r}'}")
        console.print(ctx.get_help())
        raise typer.Exit(0 if asked else 2)
    raise typer.Exit(bench_main([what, *ctx.args]))
