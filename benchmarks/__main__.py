"""``python -m benchmarks {timers,asyncio,purgatory,dispatcher,pipeline,pending,
follow,schedules,service,reads,locks}``: prints medians and ratios."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks import child_env
from benchmarks._load import LOAD_CLIENTS
from benchmarks._timers import IMPLEMENTATIONS, TIMER_WORKLOADS, Result, run_timers

ANCHOR = "asyncio"


def _table(results: list[Result], gc_on: bool) -> str:
    rows = [r for r in results if r.gc == gc_on or r.workload.startswith("W4")]
    lines = []
    keys = sorted({(r.workload, r.n) for r in rows}, key=lambda k: (k[1], k[0]))
    impls = [i for i in IMPLEMENTATIONS if any(r.impl == i for r in rows)]
    lines.append("| workload | N | " + " | ".join(impls) + " |")
    lines.append("|---|---:|" + "---:|" * len(impls))
    for workload, n in keys:
        cell = {r.impl: r for r in rows if (r.workload, r.n) == (workload, n)}
        anchor = cell.get(ANCHOR)
        out = []
        for impl in impls:
            r = cell.get(impl)
            if r is None:
                out.append("n/a")
                continue
            text = f"{r.value:,.0f} B" if r.unit == "bytes" else f"{r.value / 1e3:,.0f}k/s"
            if anchor is not None and impl != ANCHOR and anchor.value:
                text += f" ({r.value / anchor.value:.2f}x)"
            out.append(text)
        lines.append(f"| {workload} | {n:,} | " + " | ".join(out) + " |")
    return "\n".join(lines)


def _whole(text: str, low: int, high: int | None = None, what: str = "a number") -> int:
    """``text`` as a whole number from ``low`` (to ``high``), for argparse."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"{low}..{high}"
        raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
    return value


def _files_per_trigger(text: str) -> int | None:
    return None if text == "all" else _whole(text, 1, what="a number or 'all'")


def _positive(text: str) -> int:
    return _whole(text, 1)


def _non_negative(text: str) -> int:
    return _whole(text, 0)


def _operations(text: str) -> int:
    from benchmarks._purgatory import ROUND

    return _whole(text, ROUND)


def _sizes(text: str) -> list[int]:
    return [_whole(part, 1, what="a list of sizes") for part in text.split(",")]


def _counts(text: str) -> list[int]:
    if text == "none":
        return []
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None
    if not values or min(values) < 1 or max(values) > 4096:
        raise argparse.ArgumentTypeError(f"counts must be 1..4096, got {text!r}")
    return values


def _rate(text: str) -> int:
    from tickwheel.pipeline.tools.generator import MAX_RATE, MIN_RATE

    return _whole(text, MIN_RATE, MAX_RATE)


def _minutes(text: str) -> int:
    return _whole(text, 1, 24 * 60, what="a whole number of minutes")


def _driver_memory(text: str) -> str:
    from tickwheel.pipeline.contract.limits import check_driver_memory

    try:
        return check_driver_memory(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _engines(text: str) -> list[str]:
    engines = text.split(",")
    if not engines or any(e not in ("local", "spark") for e in engines):
        raise argparse.ArgumentTypeError(f"engines are local and spark, got {text!r}")
    return engines


def _follow(args: argparse.Namespace) -> int:
    from benchmarks._follow import follow_table, run_follow

    def progress(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    runs = []
    caches = {"on": [True], "off": [False], "both": [True, False]}[args.worker_cache]
    for engine in args.engines:
        for cache in caches if engine == "spark" else [True]:
            progress(f"{engine} engine{'' if cache else ', no worker cache'}, "
                     f"{args.rate:,} events/s for {args.minutes} minutes")
            runs.append(run_follow(engine, args.rate, args.minutes, args.lateness_ms,
                                   args.trigger_ms, args.master, progress, args.driver_memory,
                                   worker_cache=cache,
                                   dedupe_retention_ms=args.dedupe_retention_ms))
    memory = "" if args.driver_memory is None else f" --driver-memory {args.driver_memory}"
    if args.dedupe_retention_ms is not None:
        memory += f" --dedupe-retention-ms {args.dedupe_retention_ms}"
    print(f"follow mode at {args.rate:,} events/s for {args.minutes} minutes, --lateness-ms "
          f"{args.lateness_ms} --trigger-ms {args.trigger_ms}, Spark on {args.master}{memory}: "
          "delay after the deadline (expiries) or after resolved_ms (other outcomes) until the "
          "outcome's file was written")
    print(follow_table(runs))
    return 0 if all(run.exit_code == 0 for run in runs) else 1


def _schedules(args: argparse.Namespace) -> int:
    from benchmarks._schedule_engines import (
        CatchupRun,
        LatencyRun,
        StateRun,
        catchup,
        engine_table,
        latency,
        spark_catchup,
        state,
    )
    from benchmarks._schedules import run_schedules, table

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    results = run_schedules(args.n, args.repeat, args.memory_n)
    print(f"\nschedules benchmark: median of {args.repeat}, ratio to croniter in parentheses\n")
    print(table(results), flush=True)
    states: list[StateRun] = []
    latencies: list[LatencyRun] = []
    catchups: list[CatchupRun] = []
    if args.state_n:
        states.append(state(args.state_n, progress))
        states.append(state(args.state_n, progress, payload_bytes=200))
    if args.latency_seconds:
        for engine in args.engines:
            latencies.append(latency(engine, args.rate, args.latency_seconds,
                                     args.lateness_ms, args.master, progress))
    if args.catchup_n:
        for event_time in (False, True):
            for misfire in ("latest", "all"):
                catchups.append(catchup(args.catchup_n, misfire, progress, event_time))
        if "spark" in args.engines:
            for misfire in ("latest", "all"):
                catchups.append(spark_catchup(args.catchup_n, misfire, args.master,
                                              progress))
    if states or latencies or catchups:
        print("\nschedules held by the engines in follow mode\n")
        print(engine_table(states, latencies, catchups))
    return 0


def _phases(text: str) -> tuple[str, ...]:
    from benchmarks._service import PHASES

    chosen = tuple(part for part in text.split(",") if part)
    unknown = [part for part in chosen if part not in PHASES]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"phases are {', '.join(PHASES)}; got {text!r}")
    return chosen


def _service(args: argparse.Namespace) -> int:
    from benchmarks._service import (
        ack_table,
        run_service,
        service_table,
        signing_table,
        targets_table,
    )

    results = run_service(args.engines, args.seconds, args.batch_rate, args.single_rate,
                          args.fire_rate, args.master, args.phases, args.repeat,
                          args.load_client)
    print(f"\nservice benchmark: {args.seconds} s a phase, open loop over loopback "
          f"({args.load_client} load generator), "
          f"medians over rounds: {args.repeat}; ack latency from when each request "
          "is due; ratio to the bare aiohttp server's p99 in parentheses; fire delay from "
          "each deadline to the webhook's receipt\n")
    print(service_table(results))
    print("\nwhere the acknowledgement time went, as the service measured it (from a "
          "request's arrival; a commit's land is its keys, its file and their fsyncs)\n")
    print(ack_table(results))
    if {"targets", "hanging"} & set(args.phases):
        print("\nthree targets (a and b measured, c answering or hanging; --targets, a and "
              "b signed): fire delay from each deadline to a's and b's receipt\n")
        print(targets_table(results))
        print("\nwhat signing costs a request, in this process\n")
        print(signing_table())
    return 0


def _reads(args: argparse.Namespace) -> int:
    from benchmarks._reads import read_table, run_reads

    result = run_reads(args.n, args.seconds, args.submit_rate, args.read_rate)
    print(f"\nread benchmark: {args.n:,} schedules on the local engine, {args.seconds} s "
          f"of {args.submit_rate:,} single-row requests/s (h11 load generator, another "
          f"process) while {args.read_rate} pages/s and {args.read_rate} statuses/s are "
          "read; latency from when each read is due\n")
    print(read_table(result))
    return 0


def _locks(args: argparse.Namespace) -> int:
    import platform

    from benchmarks._locks import lock_table, run_locks
    from tickwheel._mutex import native

    print(f"\nlocks benchmark: Python {platform.python_version()}, Mutex over the C lock: "
          f"{native}; median of {args.repeat} runs of {args.n:,} cycles, uncontended, "
          "called from Python; ratio to threading.Lock in parentheses\n")
    print(lock_table(run_locks(args.n, args.repeat)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("timers", help="timer workloads W1-W4 against asyncio, sched, heapq")
    t.add_argument("--sizes", type=_sizes, default="10000,100000,1000000",
                   help="comma-separated N (default: %(default)s)")
    t.add_argument("--impls", default=",".join(IMPLEMENTATIONS))
    t.add_argument("--workloads", default="W1,W2,W3,W4")
    t.add_argument("--repeat", type=_positive, default=5, help="repetitions (median reported)")
    t.add_argument("--gc", choices=["on", "off", "both"], default="both")
    t.add_argument("--json", type=Path, help="also write the raw results here")
    t.add_argument("--pure", action="store_true",
                   help="then run the same workloads on the pure-Python build (a copy of "
                        "the sources without compiled modules, in a second process)")
    ai = sub.add_parser("asyncio", help="asyncio timers on real loops: stock, tickwheel, uvloop")
    ai.add_argument("--n", type=_positive, default=1_000_000,
                    help="pending handles in A1 and sleeping tasks in A3 (default: %(default)s)")
    ai.add_argument("--tasks", type=_positive, default=100_000,
                    help="concurrent tasks in A2 (default: %(default)s)")
    ai.add_argument("--workloads", default="A1,A2,A3")
    ai.add_argument("--repeat", type=_positive, default=3, help="repetitions (median reported)")
    ai.add_argument("--shortcuts", action="store_true",
                    help="also the tickwheel loop with each of its shortcuts off, and with "
                         "all off (tickwheel.aio.LoopShortcuts)")
    pg = sub.add_parser("purgatory", help="1M operations on 100k keys vs a naive baseline")
    pg.add_argument("--operations", type=_operations, default=1_000_000)
    pg.add_argument("--repeat", type=_positive, default=3, help="repetitions (median reported)")
    dp = sub.add_parser("dispatcher", help="1M tasks end to end through the batcher")
    dp.add_argument("--tasks", type=_positive, default=1_000_000)
    dp.add_argument("--repeat", type=_positive, default=3, help="repetitions (median reported)")
    dp.add_argument("--workers", type=_positive, default=20)
    dp.add_argument("--batch", type=_positive, default=250)
    dp.add_argument("--buffer", type=_positive, default=10_000)
    pl = sub.add_parser("pipeline", help="Spark local[1], local[2] and the reference engine")
    pl.add_argument("--events", type=_positive, default=1_000_000)
    pl.add_argument("--repeat", type=_positive, default=1, help="repetitions (median reported)")
    pl.add_argument("--spark-partitions", type=_positive, default=2,
                    help="partitions of each stage of the Spark engine")
    pl.add_argument("--files-per-trigger", type=_files_per_trigger, default=None,
                    help="input files (50,000 rows each) per micro-batch, as a stream that "
                         "arrives in parts; default 'all': the engine's default, all the "
                         "input there is in one micro-batch")
    pl.add_argument("--partitions", type=_counts, default=None,
                    help="run the scaling benchmark instead: the per-partition logic "
                         "without Spark at these partition counts, e.g. 1,4,16,64")
    pl.add_argument("--scaling-events", type=_positive, default=200_000,
                    help="events in the scaling benchmark's log (seed 7)")
    pl.add_argument("--spark-counts", type=_counts, default=[2, 32],
                    help="with --partitions: also run the Spark engine and a trivial "
                         "query on local[2] at these two partition counts, on --events "
                         "events (default 2,32; 'none' skips it)")
    pe = sub.add_parser("pending", help="micro-batches with many operations pending, "
                                        "against the same micro-batches with few")
    pe.add_argument("--pending", type=_positive, default=400_000,
                    help="watches pending throughout (default: %(default)s)")
    pe.add_argument("--files", type=_positive, default=12,
                    help="small files, a micro-batch each (default: %(default)s)")
    pe.add_argument("--rows", type=_positive, default=20_000,
                    help="rows per small file (default: %(default)s)")
    pe.add_argument("--partitions", type=_positive, default=2,
                    help="partitions of each stage (default: %(default)s)")
    pe.add_argument("--master", default="local[2]")
    pe.add_argument("--engines", type=_engines, default=["local", "spark"],
                    help="comma-separated: local, spark (default: both)")
    fo = sub.add_parser("follow", help="each engine in follow mode on a live workload: "
                                       "delays after deadlines, memory each minute")
    fo.add_argument("--rate", type=_rate, default=5_000, help="events per second")
    fo.add_argument("--minutes", type=_minutes, default=5)
    fo.add_argument("--engines", type=_engines, default=["local", "spark"],
                    help="comma-separated: local, spark (default: both, one after the other)")
    fo.add_argument("--lateness-ms", type=_non_negative, default=1_000)
    fo.add_argument("--trigger-ms", type=_positive, default=1_000)
    fo.add_argument("--master", default="local[2]")
    fo.add_argument("--driver-memory", type=_driver_memory, default=None,
                    help="the Spark engine's --driver-memory (default: its own)")
    fo.add_argument("--dedupe-retention-ms", type=_non_negative, default=None,
                    help="the engines' --dedupe-retention-ms (default: their own)")
    fo.add_argument("--worker-cache", choices=("on", "off", "both"), default="on",
                    help="Spark: whether Python workers keep the partitions they ran last; "
                         "both runs the engine once each way (default: %(default)s)")
    sc = sub.add_parser("schedules", help="next occurrences against cron libraries, and "
                                          "the memory of schedules on a timer")
    sc.add_argument("--n", type=_positive, default=1_000_000,
                    help="next-occurrence computations (default: %(default)s)")
    sc.add_argument("--memory-n", type=_non_negative, default=1_000_000,
                    help="schedules held on a timer, 0 for none (default: %(default)s)")
    sc.add_argument("--repeat", type=_positive, default=3, help="repetitions (median reported)")
    sc.add_argument("--state-n", type=_non_negative, default=1_000_000,
                    help="schedules held by the local follow engine, 0 for none "
                         "(default: %(default)s)")
    sc.add_argument("--latency-seconds", type=_non_negative, default=60,
                    help="seconds of fires on the wall clock per engine, 0 for none "
                         "(default: %(default)s)")
    sc.add_argument("--rate", type=_positive, default=10_000,
                    help="occurrences fired a second in the latency run (default: %(default)s)")
    sc.add_argument("--lateness-ms", type=_non_negative, default=100)
    sc.add_argument("--engines", type=_engines, default=["local", "spark"],
                    help="comma-separated: local, spark, for the latency and the "
                         "catch-up (default: both)")
    sc.add_argument("--master", default="local[2]")
    sc.add_argument("--catchup-n", type=_non_negative, default=1_000_000,
                    help="hourly schedules caught up after a 6 h outage, 0 for none; "
                         "on Spark (in event time) too if --engines has it "
                         "(default: %(default)s)")
    sv = sub.add_parser("service", help="the submit API and the webhook over loopback: "
                                        "acknowledged rows/s, ack latency, fire delay")
    sv.add_argument("--seconds", type=_positive, default=60, help="each phase's length")
    sv.add_argument("--batch-rate", type=_positive, default=20_000,
                    help="rows/s in requests of 100 (default: %(default)s)")
    sv.add_argument("--single-rate", type=_positive, default=2_000,
                    help="one-row requests/s (default: %(default)s)")
    sv.add_argument("--fire-rate", type=_positive, default=2_000,
                    help="'do X in 2 s' rows/s, in requests of 100 (default: %(default)s)")
    sv.add_argument("--engines", type=_engines, default=["local"],
                    help="comma-separated: local, spark (default: local)")
    sv.add_argument("--master", default="local[2]")
    sv.add_argument("--phases", type=_phases, default=("batch", "single", "fire"),
                    help="comma-separated: batch, single, fire, targets, hanging "
                         "(default: batch, single, fire)")
    sv.add_argument("--repeat", type=_positive, default=3,
                    help="rounds of every phase, interleaved (medians reported; "
                         "default: %(default)s)")
    sv.add_argument("--load-client", choices=LOAD_CLIENTS, default="h11",
                    help="the load generator's HTTP client (default: %(default)s)")
    rd = sub.add_parser("reads", help="the read API at a million schedules: a page's "
                                      "latency under submissions, the view's memory")
    rd.add_argument("--n", type=_positive, default=1_000_000, help="schedules held")
    rd.add_argument("--seconds", type=_positive, default=60)
    rd.add_argument("--submit-rate", type=_positive, default=2_000,
                    help="single-row requests/s meanwhile (default: %(default)s)")
    rd.add_argument("--read-rate", type=_positive, default=20,
                    help="pages read per second (default: %(default)s)")
    lk = sub.add_parser("locks", help="the timers' lock (Mutex) against threading.Lock")
    lk.add_argument("--n", type=_positive, default=2_000_000,
                    help="lock cycles per measurement (default: %(default)s)")
    lk.add_argument("--repeat", type=_positive, default=7, help="repetitions (median reported)")
    args = parser.parse_args(argv)

    import tickwheel


    by_name = {"follow": _follow, "pipeline": _pipeline, "pending": _pending,
               "schedules": _schedules, "service": _service, "reads": _reads,
               "locks": _locks}
    if args.what in by_name:
        return by_name[args.what](args)

    if args.what == "dispatcher":
        return _dispatcher(dp, args)

    if args.what == "asyncio":
        return _asyncio(parser, args)

    if args.what == "purgatory":
        return _purgatory(args.operations, args.repeat, tickwheel.compiled)

    sizes: list[int] = args.sizes
    impls = args.impls.split(",")
    unknown = [i for i in impls if i not in IMPLEMENTATIONS]
    if unknown:
        parser.error(f"--impls: unknown {unknown}; choose from {list(IMPLEMENTATIONS)}")
    workloads = args.workloads.split(",")
    unknown = [w for w in workloads if w not in TIMER_WORKLOADS]
    if unknown:
        parser.error(f"--workloads: unknown {unknown}; choose from {list(TIMER_WORKLOADS)}")
    gc_modes = {"on": [True], "off": [False], "both": [True, False]}[args.gc]
    start = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - start:7.1f}s] {msg}", file=sys.stderr, flush=True)

    results = run_timers(sizes, impls, workloads, args.repeat, gc_modes,
                         progress)
    print(f"\ntimers benchmark: tickwheel.compiled={tickwheel.compiled}, "
          f"median of {args.repeat}, ratio to {ANCHOR} in parentheses\n")
    for gc_on in gc_modes:
        print(f"garbage collector {'on' if gc_on else 'off'}:\n")
        print(_table(results, gc_on))
        print()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=1))
    if args.pure:
        return _pure_timers(args)
    return 0


def _pure_timers(args: argparse.Namespace) -> int:
    """The same command on the pure-Python build: the package's sources copied without
    its compiled modules, run in a second process so that neither build's modules
    shadow the other's."""
    import shutil
    import subprocess
    import tempfile

    import tickwheel

    if not tickwheel.compiled:
        print("--pure: this run was already the pure-Python build")
        return 0
    package = Path(tickwheel.__file__).parent
    with tempfile.TemporaryDirectory(prefix="tickwheel-pure-") as tmp:
        shutil.copytree(package, Path(tmp) / "tickwheel",
                        ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
        argv = [sys.executable, "-m", "benchmarks", "timers",
                "--sizes", ",".join(map(str, args.sizes)),
                "--impls", args.impls, "--workloads", args.workloads,
                "--repeat", str(args.repeat), "--gc", args.gc]
        print("pure-Python build, the same workloads in a second process:", flush=True)
        return subprocess.run(argv, env=child_env(tmp), check=False).returncode


def _asyncio(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import tickwheel
    from benchmarks._asyncio import SHORTCUT_LOOPS, available_loops, run_asyncio

    for name in ("n", "tasks", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    workloads = args.workloads.split(",")
    unknown = sorted(set(workloads) - {"A1", "A2", "A3"})
    if unknown:
        parser.error(f"--workloads: unknown {unknown}; choose from A1, A2, A3")
    loops = available_loops()
    if args.shortcuts:
        loops = [*loops, *SHORTCUT_LOOPS]
    start = time.monotonic()
    results = run_asyncio(
        args.n, args.tasks, args.repeat, loops, workloads,
        lambda msg: print(f"[{time.monotonic() - start:7.1f}s] {msg}", file=sys.stderr,
                          flush=True))
    print(f"\nasyncio benchmark: real loops, real time, tickwheel.compiled="
          f"{tickwheel.compiled}, median of {args.repeat} (bytes: one pass), "
          f"ratio to the stock loop in parentheses\n")
    print("| workload | N | " + " | ".join(loops) + " |")
    print("|---|---:|" + "---:|" * len(loops))
    for workload in dict.fromkeys(r.workload for r in results):
        cells = {r.loop: r for r in results if r.workload == workload}
        anchor = cells["asyncio"].value
        out = []
        for name in loops:
            r = cells.get(name)
            if r is None:
                out.append("n/a")
                continue
            text = (f"{r.value:,.0f} B" if r.unit == "bytes"
                    else f"{r.value / 1e3:,.0f}k {r.unit}")
            if name != "asyncio":
                text += f" ({r.value / anchor:.2f}x)"
            out.append(text)
        n = next(iter(cells.values())).n
        print(f"| {workload} | {n:,} | " + " | ".join(out) + " |")
    if "uvloop" not in loops:
        print("\nuvloop is not installed: its columns are left out")
    return 0


def _dispatcher(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from benchmarks._dispatcher import median, run_dispatcher

    if args.batch > args.buffer:
        parser.error(f"--batch ({args.batch}) must not exceed --buffer ({args.buffer})")
    start = time.monotonic()
    results = run_dispatcher(
        args.tasks, args.repeat, args.workers, args.batch, args.buffer,
        lambda msg: print(f"[{time.monotonic() - start:7.1f}s] {msg}", file=sys.stderr,
                          flush=True))
    m = median(results)
    print(f"\ndispatcher benchmark: {args.tasks:,} tasks, 20% duplicate ids, batches of "
          f"{args.batch}, {args.workers} workers, median of {args.repeat}\n")
    print("| tasks/s | delivered | overridden | overflows | expired | batches | mean batch |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {m.tasks_per_s / 1e3:,.0f}k | {m.delivered:,} | {m.overridden:,} | "
          f"{m.overflows:,} | {m.expired:,} | {m.batches:,} | {m.mean_batch:.0f} |")
    return 0


def _purgatory(operations: int, repeat: int, compiled: bool) -> int:
    from benchmarks._purgatory import ROUND, leftover_entries, run_purgatory

    start = time.monotonic()
    results, anchor, floor = run_purgatory(
        operations, repeat,
        lambda msg: print(f"[{time.monotonic() - start:7.1f}s] {msg}", file=sys.stderr,
                          flush=True))
    print(f"\npurgatory benchmark: {operations:,} operations on 1-3 of 100,000 keys, "
          f"{ROUND:,} pending at a time, median of {repeat}, compiled={compiled}\n")
    print("| engine | watch+complete ops/s | vs TimingWheelTimer schedule+cancel | "
          "expiry/s | completed by events | expired | memory before | peak | after |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    mib = 1024 * 1024
    for r in results:
        print(f"| {r.name} | {r.ops_per_s / 1e3:,.0f}k | {r.ops_per_s / anchor:.2f}x | "
              f"{r.expire_per_s / 1e3:,.0f}k | {r.completed_by_events:,} | {r.expired:,} | "
              f"{r.mem_before / mib:,.1f} MiB | {r.mem_peak / mib:,.1f} MiB | "
              f"{r.mem_after / mib:,.1f} MiB |")
    print(f"\nanchor: TimingWheelTimer schedule+cancel {anchor / 1e3:,.0f}k pairs/s "
          f"({ROUND:,} pending); the naive baseline ended holding {leftover_entries():,} "
          "entries of completed operations")
    print(f"floor: the operation's own code alone (constructed, try_complete once, freed; no "
          f"purgatory) {floor / 1e3:,.0f}k ops/s = {floor / anchor:.2f}x the anchor")
    return 0


def _pipeline(args: argparse.Namespace) -> int:
    from benchmarks._pipeline import run_pipeline

    for name in ("events", "repeat", "spark_partitions", "scaling_events"):
        if getattr(args, name) < 1:
            print(f"--{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    if args.partitions is not None:
        if args.spark_counts and len(args.spark_counts) != 2:
            print("--spark-counts: two partition counts, or 'none'", file=sys.stderr)
            return 2
        return _scaling(args)
    results = run_pipeline(args.events, args.repeat, args.spark_partitions,
                           args.files_per_trigger,
                           lambda msg: print(msg, file=sys.stderr, flush=True))
    anchor = results[0].events_per_s
    per_trigger = ("all the input" if args.files_per_trigger is None
                   else f"{args.files_per_trigger} files")
    print(f"pipeline, {results[0].rows:,} events, median of {args.repeat}, "
          f"{args.spark_partitions} partitions, {per_trigger} per micro-batch")
    print("| engine | events/s | vs reference |")
    print("|---|---:|---:|")
    for r in results:
        print(f"| {r.engine} | {r.events_per_s:,.0f} | {r.events_per_s / anchor:.2f}x |")
    by_name = {r.engine: r for r in results}
    for run in ("cold", "warm"):
        one, two = by_name[f"spark local[1] {run}"], by_name[f"spark local[2] {run}"]
        # Both masters run once per round, so a round's ratio compares runs made
        # minutes apart, in the same hour of this machine.
        rounds = ", ".join(f"{a / b:.2f}x" for a, b in zip(one.seconds, two.seconds,
                                                            strict=True))
        print(f"local[2] / local[1], {run}: {two.events_per_s / one.events_per_s:.2f}x "
              f"(rounds {rounds})")
    return 0


def _pending(args: argparse.Namespace) -> int:
    from benchmarks._pending import run_pending

    if args.files < 4:
        print("--files must be >= 4: the first two are left out", file=sys.stderr)
        return 2
    results = run_pending(args.pending, args.files, args.rows, args.partitions,
                          args.master, args.engines,
                          lambda msg: print(msg, file=sys.stderr, flush=True))
    print(f"pending: {args.files} files of {args.rows:,} rows, a micro-batch each, after "
          f"{args.pending:,} watches that stay pending (busy) or without them (quiet); "
          f"Spark on {args.master} with {args.partitions} partitions per stage; median "
          f"micro-batch from the third file on; ratio to the same engine's quiet log")
    print("| engine | log | pending at the end | median micro-batch | vs quiet | state | "
          "checkpoint on disk |")
    print("|---|---|---:|---:|---:|---:|---:|")
    mb = 1e6
    quiet = {r.engine: r for r in results if r.log == "quiet"}
    for r in results:
        print(f"| {r.engine} | {r.log} | {r.pending:,} | {r.median_s:.2f} s | "
              f"{r.median_s / quiet[r.engine].median_s:.2f}x | "
              f"{r.state_bytes / mb:,.1f} MB | {r.checkpoint_bytes / mb:,.0f} MB |")
    return 0


def _scaling(args: argparse.Namespace) -> int:
    import tickwheel
    from benchmarks._scaling import run_scaling, scaling_table

    rows = run_scaling(args.scaling_events, args.partitions, args.repeat,
                       lambda msg: print(msg, file=sys.stderr, flush=True))
    print(f"scaling, {args.scaling_events:,} generated events (seed 7), per-partition "
          f"logic without Spark, partitions one after another on one core, "
          f"tickwheel.compiled={tickwheel.compiled}, median of {args.repeat}; ratio to "
          f"the design's first count")
    print(scaling_table(rows))
    if args.spark_counts:
        from benchmarks._pipeline import run_partition_costs

        low, high = args.spark_counts
        runs = run_partition_costs(args.events, [low, high],
                                   lambda msg: print(msg, file=sys.stderr, flush=True))
        print(f"\nSpark local[2], {args.events:,} generated events, one session: each "
              f"query twice on a fresh checkpoint (cold, then warm)")
        print("| query | partitions | cold events/s | warm events/s |")
        print("|---|---:|---:|---:|")
        for query in ("engine", "trivial"):
            for count in (low, high):
                cells = [runs[f"{query} {count} {name}"] for name in ("cold", "warm")]
                print(f"| {query} | {count} | "
                      + " | ".join(f"{rows / seconds:,.0f}" for rows, seconds in cells) + " |")

        def ratio(query: str, name: str) -> float:
            rows_low, s_low = runs[f"{query} {low} {name}"]
            rows_high, s_high = runs[f"{query} {high} {name}"]
            return (rows_high / s_high) / (rows_low / s_low)

        for name in ("warm", "cold"):
            engine, trivial = ratio("engine", name), ratio("trivial", name)
            print(f"{high} / {low} partitions, {name}: engine {engine:.2f}x, trivial query "
                  f"{trivial:.2f}x; engine / trivial {engine / trivial:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
