"""The main job for now: request timeouts on a real clock, as a broker sees them.

A stream of requests arrives, each with a timeout; most get their response in time
(the timeout is cancelled), the rest time out. A periodic task reports progress. At the
end the three timers' counters are printed side by side.
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


if __name__ == "__main__":
    main()
