"""``tickwheel report``: tables and a plot from an output directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from tickwheel.cli._app import app, console, print_error
from tickwheel.pipeline.io.outputs import OutputDirError
from tickwheel.pipeline.tools.report import plot, summarize


@app.command()
def report(
    output: Annotated[Path, typer.Option(help="an engine's output directory")],
    plot_path: Annotated[Path | None, typer.Option(
        "--plot", help="where to write the plot (default: OUTPUT/report.png)")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="print the summary as one JSON object instead of tables, and "
                       "write a plot only if --plot is given")] = False,
) -> None:
    """Tables of outcomes, latencies and quarantined rows, and a plot, from an output directory."""
    if not (output / "outcomes").is_dir():
        print_error(f"{output} has no outcomes/ directory")
        raise typer.Exit(2)
    try:
        summary = summarize(output)
    except OutputDirError as exc:  # what it cannot read, in one line
        print_error(f"{exc}")
        raise typer.Exit(1) from exc
    if as_json:
        # Plain print: a console would wrap long lines and colour what a program reads.
        print(json.dumps(summary.to_json(), indent=2, ensure_ascii=False))
        if plot_path is not None:
            print(f"plot: {plot(output, plot_path)}", file=sys.stderr)
        return
    kinds = Table(title=f"{summary.total_outcomes:,} outcomes")
    shown = ["completed", "expired", "cancelled", "error"]
    if any("fired" in counts for counts in summary.outcomes.values()):
        shown.append("fired")  # occurrences of recurring schedules
    for column in ("kind", *shown, "p50 ms", "p90 ms", "p99 ms", "max ms"):
        kinds.add_column(column, justify="left" if column == "kind" else "right")
    for kind, counts in summary.outcomes.items():
        p50, p90, p99, top = summary.latency[kind]
        kinds.add_row(kind, *(f"{counts.get(o, 0):,}" for o in shown),
                      *(f"{v:,}" for v in (p50, p90, p99, top)))
    console.print(kinds)
    if "fired" in shown:
        console.print(f"occurrences skipped by misfire policies: {summary.skipped:,}")
    if summary.quarantine:
        quarantine = Table(title="quarantined rows")
        quarantine.add_column("reason")
        quarantine.add_column("rows", justify="right")
        for reason, n in summary.quarantine.items():
            quarantine.add_row(reason, f"{n:,}")
        console.print(quarantine)
    else:
        console.print("quarantined rows: none")
    console.print(f"plot: {plot(output, plot_path)}")
