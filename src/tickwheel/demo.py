"""The main job (``make run``), in four parts.

1. Request timeouts on a real clock, as a broker sees them: requests arrive with a
   timeout, most get their response in time (the timeout is cancelled), the rest time
   out; the three timers' counters side by side.
2. Recurring schedules through a daylight-saving weekend, on a manual clock: cron jobs
   in three zones and an interval, with the gap and the repeated hour in New York, and
   a stall that the misfire policy decides.
3. The pipeline: a workload generated from the broker models (produces, fetches,
   consumer sessions, tasks; with malformed and disordered rows) is resolved by the
   reference engine and by the Spark engine in local mode, whose outcomes are handed
   to a notifier through the batching dispatcher. The engines must agree row for row
   and the notifier must hear of every outcome; the report shows outcomes, latencies
   and quarantined rows, and a plot.

4. The scheduler as a service: ``tickwheel serve`` takes "do X at T" rows, cancels and
   a recurring schedule over HTTP; the orders name their target, ``orders`` (a
   receiver of their own, every request signed), and carry their data, and the
   schedule's fires go to the default webhook (stand-ins here, on loopback). It is
   killed with -9 in the middle and restarted on its checkpoint. Every outcome must
   reach its own target with its payload, and every occurrence of the schedule, none
   twice once the receivers drop resends by id.

``python -m tickwheel.demo --events N`` sizes the workload (2.5M events by default,
about seven minutes on a 2-core machine). It exits non-zero when anything disagrees.
"""
from __future__ import annotations

import base64
import itertools
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tickwheel import (
    HashedWheelTimer,
    HeapTimer,
    ManualClock,
    ProcessingResult,
    RecurringTask,
    Schedule,
    TimerBase,
    TimingWheelTimer,
)
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.delivery.sink import Delivery, OutcomeSink

REQUESTS = 60_000
ARRIVAL_WINDOW_S = 1.5
TIMEOUT_RANGE_MS = (100, 800)
ANSWERED = 0.8
#: The pipeline's workload: about seven minutes for the whole job on a 2-core machine.
DEFAULT_EVENTS = 2_500_000
#: The service part: "do X at T" rows before and after the kill, and the schedule's period.
ORDERS_BEFORE, ORDERS_AFTER, HEARTBEAT_MS = 200, 100, 500


def drive(timer: TimerBase, seed: int = 7) -> dict[str, float]:
    rng = random.Random(seed)
    timed_out = [0]

    def on_timeout() -> None:
        timed_out[0] += 1

    reporter = timer.schedule_periodic(
        500, lambda: print(f"  {timer.kind:>13}: pending={len(timer):>6} "
                           f"timed out={timed_out[0]:>6}")
    )
    start = time.monotonic()
    per_batch = 1_000
    answered = 0
    for i in range(0, REQUESTS, per_batch):
        batch = [timer.schedule(rng.randint(*TIMEOUT_RANGE_MS), on_timeout)
                 for _ in range(per_batch)]
        for task in batch:
            if rng.random() < ANSWERED and task.cancel():
                answered += 1
        # Requests arrive over the window, not all at once.
        target = start + ARRIVAL_WINDOW_S * (i + per_batch) / REQUESTS
        time.sleep(max(0.0, target - time.monotonic()))
    expected_timeouts = REQUESTS - answered
    deadline = time.monotonic() + 5.0
    while timed_out[0] < expected_timeouts and time.monotonic() < deadline:
        time.sleep(0.05)
    reporter.cancel()
    stats = timer.stats()
    return {
        "requests": REQUESTS,
        "answered": answered,
        "timed_out": timed_out[0],
        "lateness_p50_ms": stats.lateness_ms.quantile(0.5),
        "lateness_p99_ms": stats.lateness_ms.quantile(0.99),
        "lateness_max_ms": stats.lateness_ms.maximum,
        "seconds": round(time.monotonic() - start, 2),
    }


def schedules() -> None:
    """A few recurring schedules from 2026-10-31 to 2026-11-02 on a manual clock: the
    night New York falls back, an hour of stall, and what each series fired."""
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    start = int(datetime(2026, 10, 31, 12, tzinfo=UTC).timestamp() * 1000)
    clock = ManualClock(start)
    timer = TimingWheelTimer(clock=clock, executor=None)
    jobs = {
        "coupons on the hour, New York": Schedule(cron="0 * * * *", tz="America/New_York"),
        "earnings 02:00 Shanghai": Schedule(cron="0 2 * * *", tz="Asia/Shanghai"),
        "backup 01:30 New York": Schedule(cron="30 1 * * *", tz="America/New_York"),
        "tags every 15 minutes": Schedule(every_ms=15 * 60_000, misfire="all"),  # type: ignore[arg-type]
    }
    fired: dict[str, list[int]] = {name: [] for name in jobs}
    tasks: dict[str, RecurringTask] = {}

    def record(name: str) -> None:
        occurrence = tasks[name].last_occurrence_ms
        assert occurrence is not None and clock.now_ms() >= occurrence  # never early
        fired[name].append(occurrence)

    for name, schedule in jobs.items():
        tasks[name] = timer.schedule_recurring(schedule, record, name, schedule_id=name)
    stall = (start + 20 * 3_600_000, start + 21 * 3_600_000)
    while clock.now_ms() < start + 48 * 3_600_000:
        clock.advance(60_000)
        if not stall[0] <= clock.now_ms() < stall[1]:  # an hour nobody drives the timer
            timer.advance_clock(0)
    new_york = ZoneInfo("America/New_York")
    print("\nrecurring schedules, 2026-10-31 12:00Z to 2026-11-02 12:00Z "
          "(New York falls back on 11-01; the timer stalls for an hour on 11-01 08:00Z):")
    for name, task in tasks.items():
        print(f"  {name:<31} {task.runs:>4} fired, {task.skipped:>2} skipped by the "
              f"misfire policy")
    backups = [datetime.fromtimestamp(ms / 1000, new_york).strftime("%m-%d %H:%M %Z")
               for ms in fired["backup 01:30 New York"]]
    print(f"  the 01:30 backup ran at: {', '.join(backups)} (once on the day 01:30 "
          "came twice)")
    timer.close()


def _empty_or_absent(path: Path) -> bool:
    return not path.exists() or (path.is_dir() and not any(path.iterdir()))


def pipeline(events: int = DEFAULT_EVENTS, output: Path | None = None) -> Path:
    """The main job: a workload from the broker models, resolved by the Spark engine
    (local mode) and by the reference engine, which must agree row for row. Everything
    it writes goes to ``output`` (a new temporary directory by default), which must be
    empty or absent: a checkpoint or a log left there would change the run. Returns it."""
    import tempfile
    import time as _time

    from tickwheel.pipeline.engines.reference import ReferenceEngine
    from tickwheel.pipeline.io.log_reader import read_wire
    from tickwheel.pipeline.io.outputs import read_parquet_rows, write_outcomes, write_quarantine
    from tickwheel.pipeline.tools.generator import GeneratorConfig, write_event_log
    from tickwheel.pipeline.tools.report import plot, summarize

    if output is None:
        out = Path(tempfile.mkdtemp(prefix="tickwheel-demo-"))
    elif not _empty_or_absent(output):
        raise SystemExit(f"--output: {output} is not an empty directory")
    else:
        out = output
    print(f"\npipeline: generating {events:,} events from the broker models ...", flush=True)
    stats = write_event_log(GeneratorConfig(events=events, malformed_fraction=0.002,
                                            disorder_ms=2_000, schedules=24), out / "events")
    print(f"wrote {stats['rows']:,} rows ({stats['malformed']:,} malformed) in "
          f"{stats['files']} files to {out / 'events'}", flush=True)

    engine = ReferenceEngine()
    started = _time.monotonic()
    for row in read_wire(out / "events"):
        engine.feed_wire(row)
    result = engine.run()
    local_s = _time.monotonic() - started
    write_outcomes(result.outcomes, out / "local" / "outcomes")
    write_quarantine(result.quarantine, out / "local" / "quarantine")
    print(f"local engine: {result.rows_in:,} rows in {local_s:.1f} s", flush=True)
    if result.rows_in != result.rows_applied + len(result.quarantine):
        raise SystemExit("the local engine lost rows: in != applied + quarantined")

    notifier = _Notifier()
    spark_s, spark_batches, delivery = _spark(out, lambda batch, outcomes, quarantined: print(
        f"  spark micro-batch {batch}: {outcomes:,} outcomes, {quarantined:,} quarantined",
        flush=True), notifier)
    local_rows = sorted((o.op_id, o.outcome.value, o.resolved_ms, o.latency_ms, list(o.keys),
                         o.error, o.skipped) for o in result.outcomes)
    spark_rows = sorted((r["op_id"], r["outcome"], r["resolved_ms"], r["latency_ms"],
                         r["keys"], r["error"], r["skipped"])
                        for r in read_parquet_rows(out / "spark" / "outcomes"))
    local_q = sorted((q.reason.value, q.raw) for q in result.quarantine)
    spark_q = sorted((r["reason"], r["raw"])
                     for r in read_parquet_rows(out / "spark" / "quarantine"))

    summary = summarize(out / "spark")
    print(f"\n{'engine':<32}{'rows':>10}{'seconds':>9}{'events/s':>10}")
    print(f"{'spark (local[2], 2 partitions)':<32}{result.rows_in:>10,}{spark_s:>9.1f}"
          f"{result.rows_in / spark_s:>10,.0f}")
    print(f"{'local (reference)':<32}{result.rows_in:>10,}{local_s:>9.1f}"
          f"{result.rows_in / local_s:>10,.0f}")
    header = (f"{'kind':<16}{'completed':>11}{'expired':>9}{'cancelled':>11}{'error':>7}"
              f"{'fired':>7}")
    print("\n" + header + f"{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}")
    for kind, counts in summary.outcomes.items():
        p50, p90, p99, _ = summary.latency[kind]
        print(f"{kind:<16}" + "".join(f"{counts.get(o, 0):>{w},}" for o, w in (
            ("completed", 11), ("expired", 9), ("cancelled", 11), ("error", 7),
            ("fired", 7))) + f"{p50:>9,}{p90:>9,}{p99:>9,}")
    print(f"recurring schedules ('job' above): {result.schedules} held at the end, "
          f"{summary.skipped:,} occurrences skipped by their misfire policies")
    print(f"\nquarantined by reason: {summary.quarantine}")
    print(f"still pending at the end: {result.pending:,}; Spark micro-batches: "
          f"{spark_batches}")
    print(f"outputs (Parquet): {out / 'spark'} and {out / 'local'}; "
          f"plot: {plot(out / 'spark')}")
    if spark_rows != local_rows or spark_q != local_q:
        raise SystemExit(f"the engines disagree: spark {len(spark_rows):,} outcomes and "
                         f"{len(spark_q):,} quarantined, local {len(local_rows):,} and "
                         f"{len(local_q):,}")
    print(f"the Spark and local engines agree on all {len(local_rows):,} outcomes and "
          f"{len(local_q):,} quarantined rows")
    told = {(o.op_id, o.resolved_ms - o.latency_ms): o.outcome.value for o in result.outcomes}
    batches = delivery.stats.batches
    print(f"delivered through the batching dispatcher: {len(notifier.told):,} outcomes in "
          f"{sum(batches.values()):,} batches ({batches.get('congestion', 0):,} pushed back "
          f"and retried, {delivery.stats.replayed:,} tasks replayed), "
          f"{delivery.undelivered:,} undelivered")
    if notifier.told != told:
        raise SystemExit("the notifier was not told every outcome exactly as resolved")
    return out


class _Notifier:
    """What a user plugs in behind the engine: tells each client how its request ended
    (kept by operation, so a redelivered outcome changes nothing), and now and then
    pushes back like a busy downstream service."""

    def __init__(self) -> None:
        self.told: dict[tuple[str, int], str] = {}
        self._lock = threading.Lock()
        self._rng = random.Random(7)

    def process(self, task: OutcomeRow) -> ProcessingResult:
        return self.process_batch([task])

    def process_batch(self, tasks: list[OutcomeRow]) -> ProcessingResult:
        with self._lock:
            if self._rng.random() < 0.02:
                return ProcessingResult.CONGESTION
            for outcome in tasks:
                self.told[(outcome.op_id, outcome.resolved_ms - outcome.latency_ms)] = (
                    outcome.outcome.value)
        return ProcessingResult.SUCCESS


def _spark(out: Path, on_batch: Callable[[int, int, int], None],
           notifier: _Notifier) -> tuple[float, int, Delivery]:
    from tickwheel.pipeline.spark import SparkEngine, spark_session, stop_spark

    print("spark engine: starting local[2] ...", flush=True)
    spark = spark_session("local[2]")
    sink = OutcomeSink(notifier, max_batch_size=500, congestion_retry_delay_ms=100)
    try:
        engine = SparkEngine(spark, out / "events", out / "spark", out / "checkpoint",
                             partitions=2, max_files_per_trigger=4, on_batch=on_batch,
                             sink=sink)
        result = engine.run()
    finally:
        delivery = sink.close()
        stop_spark(spark)  # its JVM ended now, not while the interpreter exits
    return result.seconds, result.batches, delivery


class _Webhook:
    """A stand-in for the user's endpoint: a stdlib HTTP server on loopback that keeps
    every outcome it is sent, resends included; with a secret, it takes only requests
    whose Standard Webhooks signature verifies."""

    def __init__(self, secret: str | None = None) -> None:
        from tickwheel.service.signing import SigningKey

        self._lock = threading.Lock()
        self._received: list[dict[str, Any]] = []
        self.forged = 0
        received, lock, webhook = self._received, self._lock, self
        key = None if secret is None else SigningKey(secret)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers["content-length"]))
                if key is not None and self.headers.get("webhook-signature") != key.sign(
                        self.headers.get("webhook-id", ""),
                        int(self.headers.get("webhook-timestamp", "0")), data):
                    with lock:
                        webhook.forged += 1
                    self.send_response(401)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                body = json.loads(data)
                with lock:
                    received.extend(body["outcomes"])
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def received(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._received)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _serve(data: Path, hook: str, targets: Path) -> tuple[subprocess.Popen[str], str]:
    """``tickwheel serve`` on ``data``, delivering to ``targets`` and to ``hook``: the
    process and its API's address, once it follows (its output drained from then on,
    so a full pipe never holds it up)."""
    child = subprocess.Popen([sys.executable, "-m", "tickwheel.cli", "serve", "--data",
                              str(data), "--listen", "127.0.0.1:0", "--deliver-to", hook,
                              "--targets", str(targets)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert child.stdout is not None
    url = ""
    for line in child.stdout:
        found = re.search(r"taking rows at (http://\S+)/v1/events", line)
        url = found.group(1) if found else url
        if line.startswith("following"):
            break
    if not url:
        child.kill()
        raise RuntimeError(f"the service did not start: {child.communicate()[0]}")
    threading.Thread(target=lambda: [None for _ in child.stdout or ()], daemon=True).start()
    return child, url


def service(work: Path) -> None:
    """Part 4: rows over HTTP, outcomes to a webhook, and a kill -9 in the middle."""
    from tickwheel.client import Client

    print("\nthe scheduler as a service: tickwheel serve --data <here> --listen "
          "127.0.0.1:0 --targets targets.toml --deliver-to <a webhook here>", flush=True)
    secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    hook, orders_hook = _Webhook(), _Webhook(secret)
    work.mkdir(parents=True, exist_ok=True)
    (work / "orders.key").write_text(secret)
    targets = work / "targets.toml"
    targets.write_text(f'[targets.orders]\nurls = ["{orders_hook.url}"]\n'
                       'secret_file = "orders.key"\nmax_batch = 100\n')
    child: subprocess.Popen[str] | None = None
    try:
        child, url = _serve(work, hook.url, targets)
        start = time.time_ns() // 1_000_000
        orders = [Client.watch_row(f"order-{i}", start + 1_500 + 3 * i, target="orders",
                                   payload={"order": i, "action": "cancel unpaid"})
                  for i in range(ORDERS_BEFORE)]
        with Client(url) as client:
            client.schedule("heartbeat", Schedule(every_ms=HEARTBEAT_MS))
            client.submit(orders, idempotency_key="orders-1")
            client.submit([Client.cancel_row(f"order-{i}") for i in range(0, ORDERS_BEFORE, 4)])
        time.sleep(2.0)  # the first deadlines fire and are delivered, the rest are pending
        child.kill()  # SIGKILL: no shutdown, no flush
        child.wait()
        print(f"  {ORDERS_BEFORE} \"do X at T\" rows, {ORDERS_BEFORE // 4} cancels and a "
              f"schedule every {HEARTBEAT_MS} ms acknowledged, then kill -9", flush=True)
        child, url = _serve(work, hook.url, targets)
        now = time.time_ns() // 1_000_000
        with Client(url) as client:
            again = client.submit(orders, idempotency_key="orders-1")  # a client's retry
            client.submit([Client.watch_row(f"order-{i}", now + 1_000 + 3 * i,
                                            target="orders",
                                            payload={"order": i, "action": "cancel unpaid"})
                           for i in range(ORDERS_BEFORE, ORDERS_BEFORE + ORDERS_AFTER)])
        print(f"  restarted on its checkpoint, {ORDERS_AFTER} more rows; the first request "
              f"retried with its Idempotency-Key\n  is answered again "
              f"(replayed={again.replayed}) and not written twice", flush=True)
        want = ORDERS_BEFORE + ORDERS_AFTER
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(
                {o["op_id"] for o in orders_hook.received()}) < want:
            time.sleep(0.1)
        time.sleep(1.0)  # a few more beats
        child.terminate()
        child.wait(timeout=60)
    finally:
        if child is not None and child.poll() is None:
            child.kill()
        hook.close()
        orders_hook.close()
    _targets_summary(orders_hook, hook.received(), want)
    _service_summary(hook.received() + orders_hook.received(), want)


def _targets_summary(orders_hook: _Webhook, default: list[dict[str, Any]], want: int) -> None:
    """Each order's outcome at its own target, signed, with its payload; none at the
    default webhook."""
    orders = {o["op_id"]: o for o in orders_hook.received()}
    carried = sum(1 for op_id, o in orders.items()
                  if o["target"] == "orders" and o["payload"] == {
                      "order": int(op_id.split("-")[1]), "action": "cancel unpaid"})
    strays = [o for o in default if o["op_id"].startswith("order-")]
    print(f"  the orders target heard {len(orders)} orders, each request signed "
          f"({orders_hook.forged} refused), {carried} with their payload; the default "
          f"webhook heard {len(strays)} of them")
    if len(orders) != want or carried != want or strays or orders_hook.forged:
        raise SystemExit("an order's outcome missed its target, its payload or its "
                         "signature")


def _service_summary(received: list[dict[str, Any]], want: int) -> None:
    unique = {o["id"]: o for o in received}
    kinds: dict[str, int] = {}
    for o in unique.values():
        if o["op_id"].startswith("order-"):
            kinds[o["outcome"]] = kinds.get(o["outcome"], 0) + 1
    beats = sorted(int(o["op_id"].split("@")[1]) for o in unique.values()
                   if o["op_id"].startswith("heartbeat@"))
    gaps = [b - a for a, b in itertools.pairwise(beats) if b - a != HEARTBEAT_MS]
    orders = sum(kinds.values())
    print(f"  the webhook heard: {kinds.get('expired', 0)} expired, "
          f"{kinds.get('cancelled', 0)} cancelled, {len(beats)} heartbeats "
          f"({HEARTBEAT_MS} ms apart, {len(gaps)} missing);\n  "
          f"{len(received) - len(unique)} outcomes sent again after the kill (at least "
          "once: the receiver drops them by id)")
    if orders != want or kinds.get("cancelled", 0) != ORDERS_BEFORE // 4 or gaps or not beats:
        raise SystemExit(f"the service lost outcomes: {orders} of {want} orders, "
                         f"heartbeat gaps {gaps[:5]}")
    print("  each acknowledged row is applied once, and each outcome reaches the webhook")


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tickwheel.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=DEFAULT_EVENTS,
                        help="events in the pipeline's workload (default: %(default)s)")
    parser.add_argument("--output", type=Path, default=None,
                        help="an empty or new directory for the event log, both engines' "
                             "outputs, the checkpoint and the plot (default: a new "
                             "temporary directory)")
    args = parser.parse_args(argv)
    if args.events < 1:
        parser.error(f"--events must be at least 1, got {args.events}")
    if args.output is not None and not _empty_or_absent(args.output):
        parser.error(f"--output: {args.output} is not an empty directory")
    print(f"tickwheel demo: {REQUESTS:,} requests with timeouts of "
          f"{TIMEOUT_RANGE_MS[0]}-{TIMEOUT_RANGE_MS[1]} ms, {ANSWERED:.0%} answered in time\n")
    results: dict[str, dict[str, float]] = {}
    for timer in (TimingWheelTimer(), HashedWheelTimer(tick_ms=10), HeapTimer()):
        with timer:
            results[timer.kind] = drive(timer)
    columns = list(next(iter(results.values())))
    print()
    print(f"{'timer':<14}" + "".join(f"{c:>17}" for c in columns))
    for kind, row in results.items():
        print(f"{kind:<14}" + "".join(f"{row[c]:>17,}" for c in columns))
    lost = [k for k, r in results.items() if r["answered"] + r["timed_out"] != r["requests"]]
    if lost:
        raise SystemExit(f"requests neither answered nor timed out on: {', '.join(lost)}")
    print("\nevery request was either answered or timed out exactly once")
    schedules()
    out = pipeline(args.events, args.output)
    service(out / "service")


if __name__ == "__main__":
    main()
