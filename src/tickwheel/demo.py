"""The main job for now (``make run``), in two parts.

1. Request timeouts on a real clock, as a broker sees them: requests arrive with a
   timeout, most get their response in time (the timeout is cancelled), the rest time
   out; the three timers' counters side by side.
2. The pipeline on its embedded engine: a workload generated from the broker models
   (produces, fetches, consumer sessions, tasks; with malformed and disordered rows)
   is resolved by the reference engine, and the report shows outcomes, latencies and
   quarantined rows. (The Spark engine will run the same log; see the README.)
"""

from __future__ import annotations

import random
import time

from tickwheel import HashedWheelTimer, HeapTimer, TimerBase, TimingWheelTimer

REQUESTS = 60_000
ARRIVAL_WINDOW_S = 1.5
TIMEOUT_RANGE_MS = (100, 800)
ANSWERED = 0.8


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


def pipeline(events: int = 200_000) -> None:
    import tempfile
    import time as _time
    from pathlib import Path

    from tickwheel.pipeline.generator import GeneratorConfig, write_event_log
    from tickwheel.pipeline.io import read_events, write_outcomes, write_quarantine
    from tickwheel.pipeline.reference import ReferenceEngine
    from tickwheel.pipeline.report import plot, summarize

    out = Path(tempfile.mkdtemp(prefix="tickwheel-demo-"))
    print(f"\npipeline: generating {events:,} events from the broker models ...")
    stats = write_event_log(GeneratorConfig(events=events, malformed_fraction=0.002,
                                            disorder_ms=2_000), out / "events")
    engine = ReferenceEngine()
    started = _time.monotonic()
    for row in read_events(out / "events"):
        engine.feed(row)
    result = engine.run()
    elapsed = _time.monotonic() - started
    write_outcomes(result.outcomes, out / "output" / "outcomes")
    write_quarantine(result.quarantine, out / "output" / "quarantine")
    print(f"local engine: {result.rows_in:,} rows in {elapsed:.1f} s "
          f"({result.rows_in / elapsed:,.0f} events/s); {len(result.outcomes):,} outcomes, "
          f"{len(result.quarantine):,} quarantined (of {stats['malformed']:,} malformed), "
          f"{result.pending:,} still pending")
    assert result.rows_in == result.rows_applied + len(result.quarantine)
    summary = summarize(out / "output")
    header = f"{'kind':<16}{'completed':>11}{'expired':>9}{'cancelled':>11}{'error':>7}"
    print("\n" + header + f"{'p50 ms':>9}{'p99 ms':>9}")
    for kind, counts in summary.outcomes.items():
        p50, _, p99, _ = summary.latency[kind]
        print(f"{kind:<16}" + "".join(f"{counts.get(o, 0):>{w},}" for o, w in (
            ("completed", 11), ("expired", 9), ("cancelled", 11), ("error", 7)))
              + f"{p50:>9,}{p99:>9,}")
    print(f"\nquarantined by reason: {summary.quarantine}")
    print(f"outputs (Parquet): {out / 'output'}; plot: {plot(out / 'output')}")


def main() -> None:
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
    pipeline()


if __name__ == "__main__":
    main()
