"""The Spark engine as an application for ``spark-submit`` (``tickwheel[spark]``).

``spark-submit`` runs a Python file and brings the JVM, the master and every other
setting; this job adds only what the engine needs (see ``spark_session(master=None)``).
It takes a run's options as ``tickwheel run`` does, from the same declarations
(:data:`~tickwheel.pipeline.contract.options.RUN_OPTIONS`); the master, the driver's
memory and other Spark settings are spark-submit's own::

    PYSPARK_PYTHON="$(command -v python)" spark-submit --master 'local[2]' \\
        "$(python -m tickwheel.pipeline.spark.job --path)" --input events/ --output out/

``--path`` prints this file's path. The Python that runs Spark's workers must have
tickwheel installed (``PYSPARK_PYTHON``, or ``spark.pyspark.python``); on a cluster,
so must every executor's, or ``--zip PATH`` writes tickwheel's Python sources to a zip
for spark-submit's ``--py-files``, from which executors import its pure-Python build.
The input directory must be at the same path on every node.

Exit codes: 0 success, 1 rows were lost (in != applied + quarantined + held), 2 bad
arguments or not started by ``spark-submit``.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if __name__ == "__main__" and sys.path and sys.path[0] and (
        Path(sys.path[0]).resolve() == Path(__file__).resolve().parent):
    # spark-submit runs this as a file, which puts this file's directory first on the
    # module path: its modules (engine, ...) would stand in for any others of those
    # names.
    del sys.path[0]

from tickwheel._signals import stop_on_signals
from tickwheel.pipeline.contract.limits import FOLLOW_DEDUPE_RETENTION_MS
from tickwheel.pipeline.contract.options import RUN_OPTIONS, OptionSpec, follow_only_problem

if TYPE_CHECKING:
    from tickwheel.pipeline.spark import SparkEngine, SparkRunResult

__all__ = ["main"]

_PROG = "tickwheel.pipeline.spark.job"


def _in_range(spec: OptionSpec[object]) -> Callable[[str], int]:
    """An argparse type: an integer in ``spec``'s range, checked before Spark starts
    (which takes seconds)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        try:
            return spec.check(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def _add_option(parser: argparse.ArgumentParser, spec: OptionSpec[object]) -> None:
    """``spec`` as this parser's option: the same flag, range, default and help as
    ``tickwheel run`` gives it."""
    if spec.kind == "flag":
        parser.add_argument(spec.flag, action=argparse.BooleanOptionalAction,
                            default=spec.default, help=spec.help)
    elif spec.kind == "int":
        parser.add_argument(spec.flag, type=_in_range(spec), default=spec.default,
                            help=spec.help)
    elif spec.kind == "choice":
        parser.add_argument(spec.flag, choices=spec.choices, default=spec.default,
                            help=spec.help)
    else:
        parser.add_argument(spec.flag, type=Path, default=spec.default, help=spec.help)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG, description="Resolve an event log with the Spark engine, as a "
        "spark-submit application: every operation's outcome, and every bad row "
        "quarantined.")
    parser.add_argument("--path", action="store_true",
                        help="print this file's path, for spark-submit, and exit")
    parser.add_argument("--zip", type=Path, metavar="PATH",
                        help="write this tickwheel's Python sources to PATH, a zip for "
                             "spark-submit's --py-files (executors without tickwheel "
                             "then run its pure-Python build), print PATH and exit")
    for spec in RUN_OPTIONS:
        _add_option(parser, spec)
    return parser


def _count(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


def _follow(engine: SparkEngine, trigger_ms: int) -> SparkRunResult:
    """Until SIGINT or SIGTERM, which stop it between micro-batches; what the state
    holds then."""
    started = time.perf_counter()

    def announce(name: str) -> None:
        print(f"{name}: stopping after this micro-batch", flush=True)

    with stop_on_signals(announce) as stop:
        engine.follow(stop, trigger_ms=trigger_ms, on_batch=lambda batch: print(
            f"batch {batch.batch_id}: {batch.outcomes:,} outcomes, {batch.quarantined:,} "
            "quarantined", flush=True))
    return engine.result(started)


def _write_sources_zip(path: Path) -> Path:
    """This tickwheel's Python sources in a zip at ``path`` (written whole, then put in
    place), as spark-submit's ``--py-files`` ships them to executors: compiled modules
    cannot be imported from a zip, and the pure-Python build behaves the same."""
    from tickwheel.pipeline.io.files import write_bytes_atomically

    root = Path(__file__).resolve().parents[2]  # the tickwheel package
    sources = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", zipfile.ZIP_DEFLATED) as out:
        for source in sources:
            out.write(source, (Path(root.name) / source.relative_to(root)).as_posix())
    write_bytes_atomically(data.getvalue(), path)
    return path.resolve()


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.path:
        print(Path(__file__).resolve())
        return 0
    if args.zip is not None:
        if not args.zip.parent.is_dir():
            parser.error(f"--zip: {str(args.zip.parent)!r} is not a directory")
        if args.zip.is_dir():
            parser.error(f"--zip: {str(args.zip)!r} is a directory")
        if args.zip.exists() and not args.zip.is_file():
            # A device or a pipe would be replaced by the zip, not written to.
            parser.error(f"--zip: {str(args.zip)!r} is not a regular file")
        try:
            written = _write_sources_zip(args.zip)
        except OSError as exc:
            parser.error(f"--zip: {exc}")
        # As bytes: a name that is not UTF-8 reaches the shell as it is on disk.
        sys.stdout.buffer.write(os.fsencode(written) + b"\n")
        return 0
    if args.input is None or args.output is None:
        parser.error("--input and --output are required")
    from tickwheel.pipeline.io.input_dir import InputError, check_spark_paths, input_dir_problem
    from tickwheel.pipeline.io.outputs import DEFAULT_CHECKPOINT

    problem = input_dir_problem(args.input)
    if problem is not None:
        parser.error(f"--input: {problem}")
    problem = follow_only_problem(follow=args.follow, final=args.final,
                                  trigger_ms=args.trigger_ms, clock=args.clock)
    if problem is not None:
        parser.error(problem)
    if args.follow and args.dedupe_retention_ms is None:
        args.dedupe_retention_ms = FOLLOW_DEDUPE_RETENTION_MS
    checkpoint = args.checkpoint or args.output / DEFAULT_CHECKPOINT
    try:
        check_spark_paths(args.input, checkpoint, args.output)
    except InputError as exc:
        parser.error(str(exc))
    # How PySpark itself knows that spark-submit started it: the JVM's gateway port.
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        parser.error("start it with spark-submit (see --help), or run "
                     "`tickwheel run --engine spark`, which starts a local Spark itself")
    from tickwheel.pipeline.engines.following import wall_clock_ms
    from tickwheel.pipeline.spark import SparkEngine, spark_session

    spark = spark_session(master=None)
    try:
        try:
            engine = SparkEngine(
                spark, args.input, args.output, checkpoint,
                lateness_ms=args.lateness_ms, partitions=args.partitions,
                dedupe_retention_ms=args.dedupe_retention_ms,
                max_files_per_trigger=args.max_files_per_trigger, overwrite=args.overwrite,
                clock=wall_clock_ms if args.follow and args.clock == "wall" else None)
            if not args.follow and engine.wall_clock:
                raise ValueError(f"the checkpoint {checkpoint} follows the wall clock: run "
                                 "it with --follow --clock wall")
        except (ValueError, FileNotFoundError) as exc:
            print(f"{_PROG}: error: {exc}", file=sys.stderr)
            return 2
        result = (_follow(engine, args.trigger_ms) if args.follow
                  else engine.run(final=args.final))
    finally:
        spark.stop()
    outcomes = result.outcomes_by_outcome()
    print(f"{result.rows_in:,} rows in {result.seconds:.1f} s "
          f"({result.rows_in / max(result.seconds, 1e-9):,.0f} events/s), "
          f"{_count(result.batches, 'micro-batch', 'micro-batches')}, "
          f"{_count(engine.partitions, 'partition', 'partitions')} per stage")
    print(f"applied {result.rows_applied:,}, quarantined {result.quarantined:,} "
          f"{result.quarantined_by_reason()}, held {result.held:,}")
    print(f"outcomes {sum(outcomes.values()):,} {outcomes}, still pending "
          f"{result.pending:,}, cancels of unknown or resolved operations "
          f"{result.ignored_cancels:,}")
    if result.rows_in != result.rows_applied + result.quarantined + result.held:
        print(f"{_PROG}: rows were lost: in != applied + quarantined + held", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
