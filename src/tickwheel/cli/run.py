"""``tickwheel run``: either engine over an event log, in one batch or as a service."""

from __future__ import annotations

import enum
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import DownloadColumn
from rich.table import Table

from tickwheel.cli._app import (
    app,
    console,
    option,
    plural,
    print_error,
    progress_bar,
    stopping_on_signals,
    warn_no_input,
)
from tickwheel.pipeline.contract.events import Quarantined, Reason
from tickwheel.pipeline.contract.limits import (
    DEFAULT_DRIVER_MEMORY,
    DEFAULT_MAX_FUTURE_MS,
    DEFAULT_STOP_TIMEOUT_MS,
    FOLLOW_DEDUPE_RETENTION_MS,
    MAX_RETENTION_MS,
    MAX_TRIGGER_MS,
    check_driver_memory,
    check_spark_settings,
)
from tickwheel.pipeline.contract.options import (
    CHECKPOINT,
    CLOCK,
    DEDUPE_RETENTION_MS,
    FILES_PER_TRIGGER,
    FINAL,
    FOLLOW,
    INPUT,
    LATENESS_MS,
    OUTPUT,
    OVERWRITE,
    PARTITIONS,
    TRIGGER_MS,
    follow_only_problem,
)
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.delivery.sink import Delivery
from tickwheel.pipeline.engines.reference import ReferenceEngine
from tickwheel.pipeline.io.input_dir import (
    InputError,
    check_spark_paths,
    input_dir_problem,
    input_files,
)
from tickwheel.pipeline.io.log_reader import read_wire
from tickwheel.pipeline.io.outputs import (
    DEFAULT_CHECKPOINT,
    OutputDirError,
    count_outputs,
    outcome_writer,
    quarantine_writer,
    read_outcomes,
    take_output,
)
from tickwheel.pipeline.io.ownership import OwnershipError
from tickwheel.service.connections import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS
from tickwheel.service.server import SUBMIT_STATE

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tickwheel.dispatch import TaskProcessor
    from tickwheel.pipeline.delivery.sink import OutcomeSink
    from tickwheel.pipeline.engines.feed import IntakeFeed
    from tickwheel.pipeline.engines.following import FollowBatch, FollowingEngine
    from tickwheel.pipeline.semantics.partition import CommittedChanges
    from tickwheel.pipeline.spark import SparkEngine
    from tickwheel.service.app import ListenOptions, Service, ServiceOptions
    from tickwheel.service.outbox import Outbox


class Engine(enum.Enum):
    local = "local"
    spark = "spark"


class ClockKind(enum.Enum):
    """``--clock``'s words, those of :data:`~tickwheel.pipeline.contract.options.CLOCKS`."""

    event = "event"
    wall = "wall"


def check_driver_memory_option(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return check_driver_memory(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


@app.command()
def run(
    input: Annotated[Path, option(INPUT)],
    output: Annotated[Path, option(OUTPUT)],
    engine: Annotated[Engine, typer.Option(help="which engine resolves the log")] = Engine.local,
    lateness_ms: Annotated[int, option(LATENESS_MS)] = LATENESS_MS.default,
    dedupe_retention_ms: Annotated[int | None, option(DEDUPE_RETENTION_MS)
                                   ] = DEDUPE_RETENTION_MS.default,
    checkpoint: Annotated[Path | None, option(CHECKPOINT)] = None,
    master: Annotated[str | None, typer.Option(
        help="Spark master URL (default: local[2])")] = None,
    partitions: Annotated[int | None, option(PARTITIONS)] = PARTITIONS.default,
    max_files_per_trigger: Annotated[int | None, option(FILES_PER_TRIGGER)
                                     ] = FILES_PER_TRIGGER.default,
    driver_memory: Annotated[str | None, typer.Option(
        callback=check_driver_memory_option,
        help="Spark: the memory of the driver's JVM that this command starts, as Spark "
             "writes it (512m, 2g; default: 4g). Under spark-submit, its own "
             "--driver-memory")] = None,
    conf: Annotated[list[str] | None, typer.Option(
        "--conf", metavar="KEY=VALUE",
        help="Spark: a Spark setting, as spark-submit's --conf (spark.executor.memory=2g); "
             "repeat for more")] = None,
    overwrite: Annotated[bool, option(OVERWRITE)] = OVERWRITE.default,
    final: Annotated[bool, option(FINAL)] = FINAL.default,
    follow: Annotated[bool, option(FOLLOW)] = FOLLOW.default,
    trigger_ms: Annotated[int, option(TRIGGER_MS)] = TRIGGER_MS.default,
    max_future_ms: Annotated[int | None, typer.Option(
        min=0, max=MAX_RETENTION_MS,
        help="--follow --clock wall: rows whose ts_ms is further ahead of "
             "the wall clock are quarantined as 'future' (default: "
             f"{DEFAULT_MAX_FUTURE_MS:,} ms)")] = None,
    stop_timeout_ms: Annotated[int, typer.Option(
        min=0, max=MAX_TRIGGER_MS,
        help="--follow with --processor: how long a stop waits for the processor; what it "
             "has not settled by then is delivered at the next start")
    ] = DEFAULT_STOP_TIMEOUT_MS,
    clock: Annotated[ClockKind, option(CLOCK)] = ClockKind.event,
    metrics_port: Annotated[int | None, typer.Option(
        min=0, max=65535, help="--follow: serve Prometheus metrics on this port")] = None,
    metrics_host: Annotated[str, typer.Option(
        help="--follow: the address the metrics endpoint binds to")] = "127.0.0.1",
    processor: Annotated[str | None, typer.Option(
        help="deliver every outcome to this processor, MODULE:NAME (a TaskProcessor, or a "
             "class or function that makes one), through the batching dispatcher: at "
             "least once, retried after congestion")] = None,
    listen: Annotated[str | None, typer.Option(
        metavar="[HOST:]PORT",
        help="--follow: take rows over HTTP (POST /v1/events; GET /v1/status, /metrics) "
             "on this address, 127.0.0.1 unless a host is named; port 0 picks one (needs "
             "the service extra)")] = None,
    max_connections: Annotated[int, typer.Option(
        min=1, max=1_000_000,
        help="--listen: connections held at once (lowered to leave the engine 256 of the "
             "process's open-file limit); one beyond them is answered 503 and closed")
    ] = DEFAULT_MAX_CONNECTIONS,
    header_timeout_ms: Annotated[int, typer.Option(
        min=1, max=3_600_000,
        help="--listen: a connection that sends no complete request head for this long "
             "(idle, or sending slowly) is closed")] = round(DEFAULT_HEADER_TIMEOUT_S * 1000),
    token_file: Annotated[Path | None, typer.Option(
        help="--listen: every request must carry Authorization: Bearer <the token in "
             "this file> (one line, at least 16 printable characters); needed to listen "
             "beyond loopback")] = None,
    insecure_no_auth: Annotated[bool, typer.Option(
        "--insecure-no-auth",
        help="--listen or --metrics-host beyond loopback without credentials: anyone "
             "who reaches the port can submit, or read the metrics")] = False,
    deliver_to: Annotated[str | None, typer.Option(
        help="POST outcomes to this http(s) URL in batches, through the batching "
             "dispatcher: at least once, each with a stable id; 503, 429 and timeouts "
             "back off, other 5xx retry, other answers go to "
             "OUTPUT/dead-letter/default/ (needs the service extra)")] = None,
    targets: Annotated[Path | None, typer.Option(
        "--targets", metavar="FILE",
        help="deliver outcomes to the targets this TOML file defines ([targets.NAME] "
             "with urls, strategy, secret_file, headers, timeout_ms, max_attempts, "
             "max_batch, retry_ms), each by its own dispatcher; rows name theirs in "
             "'target', rows naming none go to --deliver-to or [targets.default]")] = None,
    worker_cache: Annotated[bool, typer.Option(
        hidden=True, help="Spark: Python workers keep the partitions they ran last (off "
                          "only to measure what that saves)")] = True,
) -> None:
    """Resolve an event log: every operation's outcome, and every bad row quarantined."""
    try:
        spark_settings = check_spark_settings(conf or [])
    except ValueError as exc:
        print_error(f"--conf: {exc}")
        raise typer.Exit(2) from exc
    if processor is not None and (deliver_to is not None or targets is not None):
        print_error("give --processor, or --deliver-to and --targets, not both")
        raise typer.Exit(2)
    address = None if listen is None else listen_options(
        listen, follow, max_connections, header_timeout_ms, token_file, insecure_no_auth)
    if listen is None and token_file is not None:
        print_error("--token-file applies to --listen only")
        raise typer.Exit(2)
    if metrics_port is not None and not insecure_no_auth:
        from tickwheel.service.auth import is_loopback

        if not is_loopback(metrics_host):
            print_error(f"--metrics-host {metrics_host} is beyond loopback, and the metrics "
                        "port takes no credentials: scrape /metrics through --listen with "
                        "--token-file, or give --insecure-no-auth")
            raise typer.Exit(2)
    outbox = _outbox(processor, deliver_to, targets, output)
    if deliver_to is not None or targets is not None:
        processor = "its targets" if targets is not None else deliver_to
    problem = follow_only_problem(follow=follow, final=final, trigger_ms=trigger_ms,
                                  clock=clock.value)
    if problem is None and not follow and metrics_port is not None:
        problem = "--metrics-port applies to --follow only"
    if problem is not None:
        print_error(problem)
        raise typer.Exit(2)
    if follow:
        retention = (FOLLOW_DEDUPE_RETENTION_MS if dedupe_retention_ms is None
                     else dedupe_retention_ms)
        if max_future_ms is not None and clock is not ClockKind.wall:
            print_error("--max-future-ms applies to --follow --clock wall")
            raise typer.Exit(2)
        future = DEFAULT_MAX_FUTURE_MS if max_future_ms is None else max_future_ms
        options = _service_options(address, trigger_ms, stop_timeout_ms,
                                   metrics=metrics_port is not None)
        if engine is Engine.spark:
            _start_metrics(metrics_port, metrics_host)
            _run_spark(input, output, lateness_ms, retention,
                       checkpoint or output / DEFAULT_CHECKPOINT, master or "local[2]",
                       partitions, max_files_per_trigger, final, overwrite,
                       service=(options, clock), max_future_ms=future,
                       outbox=outbox, driver_memory=driver_memory,
                       settings=spark_settings, worker_cache=worker_cache)
            return
        if any(option is not None
               for option in (master, partitions, driver_memory, conf)):
            print_error("--master, --partitions, --driver-memory "
                   "and --conf apply to the Spark engine only")
            raise typer.Exit(2)
        _start_metrics(metrics_port, metrics_host)
        _follow_local(input, output, checkpoint, lateness_ms, retention, clock, overwrite,
                      options, outbox, max_files_per_trigger, future)
        return
    if engine is Engine.spark:
        _run_spark(input, output, lateness_ms, dedupe_retention_ms,
                   checkpoint or output / DEFAULT_CHECKPOINT, master or "local[2]", partitions,
                   max_files_per_trigger, final, overwrite, outbox=outbox,
                   driver_memory=driver_memory, settings=spark_settings,
                   worker_cache=worker_cache)
        return
    spark_only = (checkpoint, master, partitions, max_files_per_trigger, driver_memory, conf)
    if any(option is not None for option in spark_only) or not final:
        print_error("--checkpoint, --master, --partitions, --max-files-per-trigger, "
               "--driver-memory, --conf and --no-final apply to the Spark engine only")
        raise typer.Exit(2)
    try:
        files = input_files(input, warn=False)  # the reader's listing warns
        take_output(output, overwrite=overwrite)  # held until the process exits
    except (FileNotFoundError, InputError, OwnershipError, OutputDirError) as exc:
        print_error(f"{exc}")
        raise typer.Exit(2) from exc
    _run_local(files, input, output, lateness_ms, dedupe_retention_ms, outbox, processor)


def _run_local(files: list[Path], input: Path, output: Path, lateness_ms: int,
               dedupe_retention_ms: int | None, outbox: Outbox | None, processor: str | None
               ) -> None:
    """The reference engine over a log of any size: events past what it holds in
    memory are sorted on disk (unnamed files in ``output``, gone with the process), and
    outcomes and quarantined rows go to their files as they come."""
    reference = ReferenceEngine(lateness_ms=lateness_ms,
                                dedupe_retention_ms=dedupe_retention_ms, spill_dir=output)
    started = time.monotonic()
    total = sum(_size(path) for path in files)
    reasons: Counter[str] = Counter()

    def quarantine(rows: list[Quarantined]) -> None:
        reasons.update(q.reason.value for q in rows)
        quarantined.write(rows)

    try:
        with quarantine_writer(output / "quarantine") as quarantined, \
                outcome_writer(output / "outcomes") as outcomes:
            with progress_bar(DownloadColumn()) as progress:
                task = progress.add_task(f"reading {len(files)} files", total=total)
                for row in read_wire(input, on_bytes=lambda n: progress.advance(task, n)):
                    reference.feed_wire(row)
                    if reference.result.quarantine:  # the writer holds it, within bounds
                        quarantine(reference.take_quarantine())
            quarantine(reference.take_quarantine())
            spilled = reference.spilled_runs
            events = reference.result.rows_in - sum(reasons.values())
            with progress_bar() as progress:
                task = progress.add_task(
                    "resolving" + (f" {spilled} runs sorted on disk" if spilled else ""),
                    total=events)
                for resolved, duplicates in reference.resolve():
                    outcomes.write(resolved)
                    quarantine(duplicates)
                    progress.update(task, completed=reference.result.rows_applied
                                    + reasons[Reason.DUPLICATE_OP_ID.value])
    except OSError as exc:  # a full disk, an input that cannot be read
        print_error(f"the run stopped, and wrote no outputs: {exc}")
        raise typer.Exit(1) from exc
    result = reference.result
    _print_run("local engine", time.monotonic() - started, result.rows_in,
               result.rows_applied, dict(reasons), outcomes.rows, result.pending,
               result.ignored_cancels, held=0, schedules=result.schedules,
               skipped=result.skipped)
    if not files:
        warn_no_input(input)
    if outbox is not None:
        with console.status(f"delivering {outcomes.rows:,} outcomes to {processor}"):
            deliveries = outbox.deliver(read_outcomes(outcomes.path))
        outbox.close()
        _finish_delivery(outbox, deliveries, f"they are in {outcomes.path}")


def _size(path: Path) -> int:
    """A file's size for progress; 0 once gone (its reader passes over it)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _outbox(processor: str | None, deliver_to: str | None, targets: Path | None,
            output: Path) -> Outbox | None:
    """Where outcomes go: the user's processor, or the targets of ``--targets`` and
    ``--deliver-to``; refused before any work (exit 2, naming the option and the key)
    if they are unusable or the extra is missing."""
    if processor is not None:
        from tickwheel.service.outbox import Outbox

        return Outbox.for_processor(_load_processor(processor))
    if deliver_to is None and targets is None:
        return None
    option = "--targets" if targets is not None else "--deliver-to"
    try:
        from tickwheel.service.outbox import Outbox
        from tickwheel.service.targets import (
            DEFAULT_TARGET,
            TargetsError,
            load_targets,
            target_for_url,
        )
    except ImportError as exc:
        print_error(f"{option} needs the service extra: pip install 'tickwheel[service]'")
        raise typer.Exit(2) from exc
    try:
        specs = {} if targets is None else load_targets(targets)
    except TargetsError as exc:
        print_error(f"--targets {exc}")
        raise typer.Exit(2) from exc
    if deliver_to is not None:
        if DEFAULT_TARGET in specs:
            print_error(f"--deliver-to and [targets.{DEFAULT_TARGET}] in --targets both "
                        "name the default target: give one")
            raise typer.Exit(2)
        try:
            specs[DEFAULT_TARGET] = target_for_url(deliver_to)
        except ValueError as exc:
            print_error(f"--deliver-to: {exc}")
            raise typer.Exit(2) from exc
    return Outbox.for_targets(specs, output)


def _load_processor(spec: str) -> TaskProcessor[OutcomeRow]:
    """The user's processor named by ``MODULE:NAME``, made before any work starts; a
    name that cannot be loaded is refused (exit 2)."""
    import importlib

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        print_error(f"--processor must be MODULE:NAME, got {spec!r}")
        raise typer.Exit(2)
    try:
        found: object = importlib.import_module(module_name)
        for part in attr.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        print_error(f"--processor {spec}: {exc}")
        raise typer.Exit(2) from exc
    made = found
    if isinstance(found, type) or (callable(found) and not hasattr(found, "process_batch")):
        try:
            made = found()
        except Exception as exc:
            print_error(f"--processor {spec}: making it raised {exc!r}")
            raise typer.Exit(2) from exc
    if not callable(getattr(made, "process_batch", None)):
        print_error(f"--processor {spec}: {made!r} has no process_batch(outcomes) "
               "method")
        raise typer.Exit(2)
    return made  # type: ignore[return-value]


def _print_delivery(outbox: Outbox, deliveries: Mapping[str, Delivery]) -> None:
    for route, delivery in deliveries.items():
        stats = delivery.stats
        failed = (f", {delivery.failed:,} failed (the processor raised)" if delivery.failed
                  else "")
        refused = stats.dropped - delivery.failed
        webhook = outbox.webhooks.get(route)
        where = ("" if webhook is None or not refused
                 else f" (kept in {webhook.dead_letters})")
        to = "" if outbox.takes_all else (
            "unknown targets: " if route == "*" else f"{route}: ")
        console.print(f"{to}delivered {stats.tasks.get('success', 0):,} outcomes in "
                      f"{stats.batches.get('success', 0):,} batches; "
                      f"{refused:,} refused by the processor{where}, "
                      f"{delivery.undelivered:,} not delivered in time{failed}")


def _changed_note(changed: int) -> str:
    return (f"; {changed:,} input files changed after they were read (see the log)"
            if changed else "")


def _finish_delivery(outbox: Outbox, deliveries: Mapping[str, Delivery], where: str) -> None:
    """The end of a batch run's delivery: exit 1 if an outcome was not delivered."""
    _print_delivery(outbox, deliveries)
    failed = sum(d.failed for d in deliveries.values())
    lost = failed + sum(d.undelivered for d in deliveries.values())
    if lost:
        print_error(f"{lost:,} outcomes are not delivered ({failed:,} to a processor "
                    f"that raised): {where}")
        raise typer.Exit(1)


def _start_metrics(port: int | None, host: str) -> None:
    """Serve the metrics endpoint before any work, so that a port in use or an address
    this machine does not have is refused at once (exit 2); the run's counts join it
    once its engine exists (:func:`_serve_metrics`)."""
    if port is None:
        return
    try:
        from prometheus_client import start_http_server
    except ImportError as exc:
        print_error("--metrics-port needs the metrics extra: "
               "pip install 'tickwheel[metrics]'")
        raise typer.Exit(2) from exc
    try:
        server, _ = start_http_server(port, addr=host)
    except OSError as exc:  # in use, not this machine's address, or no such host
        print_error(f"--metrics-host {host} --metrics-port {port}: cannot serve "
               f"metrics there: {exc.strerror or exc}")
        raise typer.Exit(2) from exc
    shown = f"[{host}]" if ":" in host else host
    # The port it got: with --metrics-port 0 the system picks one.
    console.print(f"metrics on http://{shown}:{server.server_port}/metrics")


def listen_options(listen: str, follow: bool, max_connections: int, header_timeout_ms: int,
                   token_file: Path | None, insecure: bool) -> ListenOptions:
    """What --listen and its options say, refused (exit 2, naming the option) before
    any work."""
    host, port = _check_listen(listen, follow)  # the service extra is there
    from tickwheel.service.app import ListenOptions

    return ListenOptions(host, port, max_connections, header_timeout_ms / 1000,
                         _check_token(token_file, listen, host, insecure))


def _check_token(token_file: Path | None, listen: str, host: str,
                 insecure: bool) -> str | None:
    """The token every request must carry, or None; refused (exit 2) before any work
    if its file is unusable, or if the listener is beyond loopback without one."""
    from tickwheel.service.auth import TokenError, is_loopback, read_token

    if token_file is not None:
        try:
            return read_token(token_file)
        except TokenError as exc:
            print_error(f"--token-file {exc}")
            raise typer.Exit(2) from exc
    if not is_loopback(host) and not insecure:
        print_error(f"--listen {listen} is beyond loopback: give --token-file (every "
                    "request then needs the token), or --insecure-no-auth to let anyone "
                    "who reaches the port submit")
        raise typer.Exit(2)
    return None


def _check_listen(value: str, follow: bool) -> tuple[str, int]:
    """--listen's address, refused (exit 2) before any work if it is malformed, if the
    run is not a service, or if the service extra is missing."""
    if not follow:
        print_error("--listen applies to --follow only")
        raise typer.Exit(2)
    try:
        from tickwheel.service.server import parse_listen

        return parse_listen(value)
    except ImportError as exc:
        print_error("--listen needs the service extra: pip install 'tickwheel[service]'")
        raise typer.Exit(2) from exc
    except ValueError as exc:
        print_error(f"--listen: {exc}")
        raise typer.Exit(2) from exc


def _service_options(listen: ListenOptions | None, trigger_ms: int, stop_timeout_ms: int,
                     *, metrics: bool) -> ServiceOptions:
    from tickwheel.service.app import ServiceOptions

    return ServiceOptions(listen=listen, trigger_ms=trigger_ms,
                          stop_timeout_ms=stop_timeout_ms, metrics=metrics)


def _service(options: ServiceOptions, checkpoint: Path, outbox: Outbox | None, *,
             floor_file: bool = False) -> Service:
    from tickwheel.service.app import Service

    return Service(options, checkpoint / SUBMIT_STATE, outbox=outbox, floor_file=floor_file)


def _follow_local(input: Path, output: Path, checkpoint: Path | None, lateness_ms: int,
                  dedupe_retention_ms: int, clock: ClockKind, overwrite: bool,
                  options: ServiceOptions, outbox: Outbox | None,
                  max_files_per_batch: int | None = None,
                  max_future_ms: int = DEFAULT_MAX_FUTURE_MS) -> None:
    from tickwheel.pipeline.engines.follow import LocalFollowEngine
    from tickwheel.pipeline.engines.following import wall_clock_ms

    with _service(options, checkpoint or output / DEFAULT_CHECKPOINT, outbox) as service:
        try:
            follower = LocalFollowEngine(
                input, output, checkpoint_dir=checkpoint, lateness_ms=lateness_ms,
                dedupe_retention_ms=dedupe_retention_ms,
                clock=wall_clock_ms if clock is ClockKind.wall else None,
                overwrite=overwrite, sink=service.sink,
                max_files_per_batch=max_files_per_batch, max_future_ms=max_future_ms,
                feed=service.feed, on_commit=service.on_commit)
        except (FileNotFoundError, InputError, OutputDirError, ValueError,
                OwnershipError) as exc:
            print_error(f"{exc}")
            raise typer.Exit(2) from exc
        _serve(service, follower, "batch",
               f"following {input} (trigger {options.trigger_ms} ms, {clock.value} clock, "
               f"checkpoint {follower.checkpoint_dir})")


def _serve(service: Service, engine: FollowingEngine, unit: str, following: str) -> None:
    """Start ``service`` with ``engine``, run it until SIGINT or SIGTERM, and report."""
    from tickwheel.service.app import ListenError, ServiceError

    try:
        service.start(engine)
    except ListenError as exc:
        listen = service.options.listen
        where = "" if listen is None else f" {listen.host}:{listen.port}"
        print_error(f"--listen{where}: {exc}")
        raise typer.Exit(2) from exc
    except ServiceError as exc:
        print_error(f"{exc}")
        raise typer.Exit(2) from exc
    if service.url is not None:
        console.print(f"taking rows at {service.url}/v1/events")
    last_print = 0.0

    def progress(batch: FollowBatch) -> None:
        nonlocal last_print
        now = time.monotonic()
        if batch.outcomes or batch.quarantined or now - last_print >= 10:
            counts = engine.counts()
            lag = "" if batch.lag_ms is None else f", time {batch.lag_ms:,} ms behind the clock"
            files = "" if batch.files is None else f"{batch.files} files, "
            console.print(f"{unit} {batch.batch_id}: {files}{batch.rows:,} rows, "
                          f"{batch.outcomes:,} outcomes, {batch.quarantined:,} quarantined; "
                          f"{counts.pending:,} pending, {counts.held:,} held{lag}"
                          f"{_skipped_note(counts.files_skipped)}"
                          f"{_changed_note(counts.files_changed)}")
            last_print = now

    with stopping_on_signals() as stop:  # before saying so: a signal from then on stops it
        console.print(f"{following}; SIGINT or SIGTERM stops")
        try:
            result = service.follow(stop, on_batch=progress)
        except (OSError, OwnershipError) as exc:  # a full disk, the checkpoint taken away
            print_error(f"the service stopped in {unit} {engine.counts().batches}: {exc}")
            if service.outbox is not None:
                _print_delivery(service.outbox, service.close())
            raise typer.Exit(1) from exc
    counts = engine.counts()
    console.print(f"stopped after {plural(result.batches, unit)}: {result.rows_in:,} rows, "
                  f"{result.outcomes:,} outcomes, {result.quarantined:,} quarantined; "
                  f"{counts.pending:,} pending, {counts.held:,} held")
    if service.outbox is not None:
        # The stop waited for the processor already: what it holds now is abandoned.
        _print_delivery(service.outbox, service.close())
        if result.undelivered:
            console.print(f"{result.undelivered:,} outcomes not delivered: the next start "
                          "delivers them")


def _run_spark(input: Path, output: Path, lateness_ms: int, dedupe_retention_ms: int | None,
               checkpoint: Path, master: str, partitions: int | None,
               max_files_per_trigger: int | None, final: bool, overwrite: bool,
               service: tuple[ServiceOptions, ClockKind] | None = None,
               outbox: Outbox | None = None,
               driver_memory: str | None = None,
               settings: dict[str, str] | None = None,
               max_future_ms: int = DEFAULT_MAX_FUTURE_MS,
               worker_cache: bool = True) -> None:
    """The Spark engine over the log, in one run; or, with ``service`` (its options and
    clock), as the service."""
    follow = service is not None
    try:
        from tickwheel.pipeline.engines.following import wall_clock_ms
        from tickwheel.pipeline.spark import spark_session, stop_spark
    except ImportError as exc:  # pragma: no cover - depends on the install
        print_error("the Spark engine needs its extra: "
               "pip install 'tickwheel[spark]'")
        raise typer.Exit(2) from exc
    problem = input_dir_problem(input)
    if problem is not None:
        print_error(f"{problem}")
        raise typer.Exit(2)
    try:  # before Spark starts, and its log goes into the checkpoint (checked again)
        files = check_spark_paths(input, checkpoint, output)
        # Held until the process exits; the engine's hold is the same one.
        take_output(output, overwrite=overwrite, checkpoint=checkpoint)
    except (InputError, OwnershipError, OutputDirError) as exc:
        print_error(f"{exc}")
        raise typer.Exit(2) from exc
    if not files and not follow:
        warn_no_input(input)
    memory = driver_memory or DEFAULT_DRIVER_MEMORY
    console.print(f"starting Spark ({master}, driver memory {memory})")
    from pyspark.sql import SparkSession

    started_here = SparkSession.getActiveSession() is None  # else a caller's, kept
    try:
        spark = spark_session(master, driver_memory=memory, settings=settings)
    except RuntimeError as exc:  # no JVM, or one that stopped at once
        print_error(f"could not start Spark: {exc}")
        raise typer.Exit(1) from exc
    try:
        if service is not None:
            options, clock = service
            with _service(options, checkpoint, outbox, floor_file=True) as running:
                spark_engine = _spark_engine(
                    spark, input, output, checkpoint, lateness_ms, partitions,
                    max_files_per_trigger, dedupe_retention_ms,
                    wall_clock_ms if clock is ClockKind.wall else None, running.sink,
                    max_future_ms, worker_cache, feed=running.feed,
                    on_commit=running.on_commit)
                _serve(running, spark_engine, "micro-batch",
                       f"following {input} on Spark ({spark_engine.partitions} partitions, "
                       f"trigger {options.trigger_ms} ms, {clock.value} clock, checkpoint "
                       f"{checkpoint})")
            return
        spark_engine = _spark_engine(spark, input, output, checkpoint, lateness_ms,
                                     partitions, max_files_per_trigger, dedupe_retention_ms,
                                     None, None if outbox is None else outbox.sink,
                                     max_future_ms, worker_cache)
        if spark_engine.wall_clock:
            print_error(f"the checkpoint {checkpoint} follows the wall clock: run it with "
                        "--follow --clock wall")
            raise typer.Exit(2)
        console.print(f"running the query ({spark_engine.partitions} partitions, checkpoint "
                      f"{checkpoint})")
        with console.status("first micro-batch") as status:
            written = [0, 0]  # outcomes, quarantined rows

            def progress(batch_id: int, outcomes: int, quarantined: int) -> None:
                written[0] += outcomes
                written[1] += quarantined
                status.update(f"micro-batch {batch_id} done: {written[0]:,} outcomes, "
                              f"{written[1]:,} quarantined rows")

            spark_engine.on_batch = progress
            result = spark_engine.run(final=final)
        reasons = count_outputs(output / "quarantine", "reason")
        outcomes = sum(count_outputs(output / "outcomes", "outcome").values())
        _print_run(f"Spark engine ({master}, {spark_engine.partitions} partitions, "
                   f"{plural(result.batches, 'micro-batch')})",
                   result.seconds, result.rows_in,
                   result.rows_applied, reasons, outcomes, result.pending,
                   result.ignored_cancels, held=result.held, schedules=result.schedules,
                   skipped=result.skipped)
        if outbox is not None:
            _finish_delivery(outbox, outbox.close(),
                             "the next run on this checkpoint delivers them")
    finally:
        # The JVM ended and its output read before the interpreter exits: a thread
        # that logs its last lines while it exits would abort the process.
        if started_here:
            stop_spark(spark)


def _spark_engine(spark: SparkSession, input: Path, output: Path, checkpoint: Path,
                  lateness_ms: int, partitions: int | None,
                  max_files_per_trigger: int | None, dedupe_retention_ms: int | None,
                  clock: Callable[[], int] | None,
                  sink: OutcomeSink | Mapping[str, OutcomeSink] | None, max_future_ms: int,
                  worker_cache: bool, *, feed: IntakeFeed | None = None,
                  on_commit: Callable[[CommittedChanges], object] | None = None,
                  ) -> SparkEngine:
    """The engine, or exit 2 with what its options or its checkpoint refuse."""
    from tickwheel.pipeline.spark import SparkEngine

    try:
        return SparkEngine(spark, input, output, checkpoint, lateness_ms=lateness_ms,
                           partitions=partitions, max_files_per_trigger=max_files_per_trigger,
                           dedupe_retention_ms=dedupe_retention_ms, clock=clock, sink=sink,
                           max_future_ms=max_future_ms, worker_cache=worker_cache, feed=feed,
                           on_commit=on_commit)
    except ValueError as exc:
        print_error(f"{exc}")
        raise typer.Exit(2) from exc


def _skipped_note(files: int) -> str:
    return f"; {plural(files, 'input file')} skipped" if files else ""


def _print_run(title: str, elapsed: float, rows_in: int, applied: int,
               quarantined: dict[str, int], outcomes: int, pending: int, ignored: int,
               held: int, schedules: int = 0, skipped: int = 0) -> None:
    table = Table(title=f"{title}: {rows_in:,} rows in {elapsed:.1f} s "
                        f"({rows_in / max(elapsed, 1e-9):,.0f} events/s)")
    table.add_column("")
    table.add_column("count", justify="right")
    table.add_row("rows applied", f"{applied:,}")
    table.add_row("rows quarantined", f"{sum(quarantined.values()):,}")
    for reason, n in sorted(quarantined.items()):
        table.add_row(f"  {reason}", f"{n:,}")
    if held:
        table.add_row("rows held (time has not passed them)", f"{held:,}")
    table.add_row("outcomes", f"{outcomes:,}")
    table.add_row("still pending at the end", f"{pending:,}")
    table.add_row("cancels of unknown or resolved operations", f"{ignored:,}")
    if schedules or skipped:
        table.add_row("recurring schedules held at the end", f"{schedules:,}")
        table.add_row("  occurrences skipped by misfire policies", f"{skipped:,}")
    console.print(table)
    if rows_in != applied + sum(quarantined.values()) + held:
        print_error("rows were lost: in != applied + quarantined + held")
        raise typer.Exit(1)
