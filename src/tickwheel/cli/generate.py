"""``tickwheel generate``: a workload from the broker models, as an event log."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import MofNCompleteColumn

from tickwheel.cli._app import app, console, print_error, progress_bar, stopping_on_signals
from tickwheel.pipeline.io.input_dir import is_input_name
from tickwheel.pipeline.tools.generator import (
    MAX_RATE,
    MIN_RATE,
    GeneratorConfig,
    follow_event_log,
    write_event_log,
)


@app.command()
def generate(
    output: Annotated[Path, typer.Option(help="directory to write the event log into")],
    events: Annotated[int, typer.Option(min=1, help="rows to generate")] = 100_000,
    seed: Annotated[int, typer.Option(help="same seed, same log")] = 1,
    malformed: Annotated[float, typer.Option(min=0.0, max=1.0,
                                             help="extra malformed rows, as a fraction")] = 0.0,
    disorder_ms: Annotated[int, typer.Option(min=0, help="bounded disorder of rows")] = 0,
    rows_per_file: Annotated[int, typer.Option(min=1)] = 20_000,
    gzip: Annotated[bool, typer.Option(
        "--gzip", help="write the files gzip'd (events-00001.jsonl.gz, ...)")] = False,
    follow: Annotated[bool, typer.Option(
        help="write the workload as it happens, with wall-clock ts_ms, until SIGINT or "
             "SIGTERM (--events and --rows-per-file do not apply)")] = False,
    rate: Annotated[int, typer.Option(
        min=MIN_RATE, max=MAX_RATE, help="--follow: about this many events per second")
    ] = 5_000,
    file_ms: Annotated[int, typer.Option(
        min=1, max=3_600_000, help="--follow: a file per this much time; keep it within "
                                   "the engines' lateness bound")] = 1_000,
    schedules: Annotated[int, typer.Option(
        min=0, max=10_000_000, help="recurring schedules in the log (intervals, and cron "
                                    "in several zones), some paused and resumed")] = 0,
) -> None:
    """Generate a workload from the broker models and write it as JSON Lines files."""
    if output.exists() and not output.is_dir():
        print_error(f"--output {output} exists and is not a directory")
        raise typer.Exit(2)
    if not follow and output.is_dir():
        # Files of an earlier log would be read with this one, and its own names would
        # replace some of them: refused, as Spark's writers refuse an existing output.
        # A live log's files are named by time, so a restarted --follow carries on.
        held = sorted(p.name for p in output.iterdir() if is_input_name(p.name))
        if held:
            shown = ", ".join(repr(name) for name in held[:3])
            print_error(f"--output {output} already holds {len(held)} input files "
                   f"({shown}{', ...' if len(held) > 3 else ''}): give an empty or "
                   "new directory")
            raise typer.Exit(2)
    if follow:
        _generate_live(GeneratorConfig(seed=seed, malformed_fraction=malformed,
                                       disorder_ms=disorder_ms, schedules=schedules),
                       output, rate, file_ms, gzip)
        return
    started = time.monotonic()
    config = GeneratorConfig(events=events, seed=seed, malformed_fraction=malformed,
                             disorder_ms=disorder_ms, rows_per_file=rows_per_file,
                             schedules=schedules)
    total = events + int(events * malformed)
    # SIGINT or SIGTERM stops it after the file being written (a second SIGINT at once).
    with stopping_on_signals("after this file") as stop, \
            progress_bar(MofNCompleteColumn()) as progress:
        task = progress.add_task("generating", total=total)
        try:
            stats = write_event_log(config, output,
                                    on_rows=lambda n: progress.advance(task, n), gzip=gzip,
                                    stop=stop)
        except KeyboardInterrupt:
            stop.set()
        if stop.is_set():
            progress.stop()
            files = sorted(output.glob("events-*.jsonl*"))
            console.print(f"interrupted: {output} holds {len(files)} whole files")
            raise typer.Exit(130)
    console.print(f"wrote {stats['rows']:,} rows ({stats['malformed']:,} malformed) in "
                  f"{stats['files']} files to {output} in {time.monotonic() - started:.1f} s")


def _generate_live(config: GeneratorConfig, output: Path, rate: int, file_ms: int,
                   gzip: bool) -> None:
    started = time.monotonic()
    written = {"rows": 0, "last": 0.0}

    def on_file(rows: int, behind_ms: int) -> None:
        written["rows"] += rows
        now = time.monotonic()
        if now - written["last"] >= 10:
            behind = f", {behind_ms:,} ms behind the clock" if behind_ms > file_ms else ""
            console.print(f"{written['rows']:,} rows in {now - started:.0f} s "
                          f"({written['rows'] / max(now - started, 1e-9):,.0f}/s){behind}")
            written["last"] = now

    with stopping_on_signals("after this file") as stop:
        console.print(f"writing about {rate:,} events/s to {output}, a file every {file_ms} "
                      "ms; SIGINT or SIGTERM stops")
        counts = follow_event_log(config, output, rate, stop, file_ms=file_ms,
                                  on_file=on_file, gzip=gzip)
    console.print(f"stopped: {counts['rows']:,} rows ({counts['malformed']:,} malformed) in "
                  f"{counts['files']} files")
