"""Recurring schedules: next-occurrence computations against cron libraries, and the
memory of schedules held on a timer.

Next occurrences: N (spec, zone, time) triples, half intervals of 1 s to 1 h, half
cron in 20 zones, each answered by ``Schedule.next_after``; the cron half also by
croniter (an iterator per spec, moved with ``set_current``) and cronsim (built per
call: it takes its start only at construction), where installed. Reported: rates and
the ratio to croniter, the anchor, measured in the same run.

Memory: N schedules of the same mix registered with ``schedule_recurring`` on one
TimingWheelTimer, counted by tracemalloc, in bytes per schedule.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
import tracemalloc
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from tickwheel import ManualClock, Schedule, TimingWheelTimer

__all__ = ["CRON_SPECS", "ZONES", "ScheduleResult", "run_schedules"]

ZONES = [
    "UTC", "America/New_York", "America/Chicago", "America/Los_Angeles", "America/Sao_Paulo",
    "America/Santiago", "Europe/London", "Europe/Berlin", "Europe/Moscow", "Africa/Cairo",
    "Asia/Dubai", "Asia/Kolkata", "Asia/Shanghai", "Asia/Tokyo", "Asia/Tehran",
    "Australia/Sydney", "Australia/Lord_Howe", "Pacific/Auckland", "Pacific/Chatham",
    "America/St_Johns",
]
CRON_SPECS = [
    "0 * * * *", "*/15 * * * *", "0 2 * * *", "30 9 * * mon-fri", "0 0 1 * *",
    "*/5 8-18 * * 1-5", "15 3 * * sun", "0 12 1,15 * *", "45 23 * * *", "0 */6 * * *",
]
YEAR_2026_MS = 1_767_225_600_000
YEAR_MS = 365 * 86_400_000


@dataclass(frozen=True, slots=True)
class ScheduleResult:
    workload: str
    impl: str
    n: int
    value: float
    unit: str


def _mix(n: int, seed: int) -> list[tuple[Schedule, int]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 2 == 0:
            schedule = Schedule(every_ms=rng.randint(1, 3_600) * 1_000)
        else:
            schedule = Schedule(cron=rng.choice(CRON_SPECS), tz=rng.choice(ZONES))
        out.append((schedule, YEAR_2026_MS + rng.randrange(YEAR_MS)))
    return out


def _rate(n: int, fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return n / (time.perf_counter() - start)


def _next_occurrences(n: int, repeat: int, seed: int) -> list[ScheduleResult]:
    triples = _mix(n, seed)
    cron = [(s, t) for s, t in triples if s.cron is not None]
    results: dict[str, list[float]] = {}

    def ours_all() -> None:
        for s, t in triples:
            s.next_after(t)

    def ours_cron() -> None:
        for s, t in cron:
            s.next_after(t)

    runs: dict[str, object] = {"tickwheel, all": ours_all, "tickwheel": ours_cron}
    try:
        from croniter import croniter

        zones = {name: ZoneInfo(name) for name in ZONES}
        starts = [datetime.fromtimestamp(t / 1000, zones[s.tz]) for s, t in cron]
        iterators = {(s.cron, s.tz): croniter(s.cron, starts[0]) for s, _ in cron}
        keyed = [(iterators[(s.cron, s.tz)], start) for (s, _), start in
                 zip(cron, starts, strict=True)]

        def croniter_cron() -> None:
            for it, start in keyed:
                it.set_current(start, force=True)
                it.get_next(datetime)

        runs["croniter"] = croniter_cron
    except ImportError:
        pass
    try:
        import cronsim

        zones = {name: ZoneInfo(name) for name in ZONES}
        starts = [datetime.fromtimestamp(t / 1000, zones[s.tz]) for s, t in cron]
        pairs = [(s.cron or "", start) for (s, _), start in zip(cron, starts, strict=True)]

        def cronsim_cron() -> None:
            for text, start in pairs:
                next(cronsim.CronSim(text, start))

        runs["cronsim (parses per call)"] = cronsim_cron
    except ImportError:
        pass
    for _ in range(repeat):
        for name, fn in runs.items():
            count = len(triples) if name == "tickwheel, all" else len(cron)
            results.setdefault(name, []).append(_rate(count, fn))
    return [ScheduleResult("next occurrence", name, len(triples) if name == "tickwheel, all"
                           else len(cron), statistics.median(rates), "per_s")
            for name, rates in results.items()]


def _memory(n: int, seed: int) -> ScheduleResult:
    clock = ManualClock(YEAR_2026_MS)
    timer = TimingWheelTimer(clock=clock, executor=None)
    rng = random.Random(seed)
    specs = [(rng.randint(1, 3_600) * 1_000, rng.choice(CRON_SPECS), rng.choice(ZONES))
             for _ in range(n)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    tasks = []
    for i, (every, cron, tz) in enumerate(specs):
        schedule = Schedule(every_ms=every) if i % 2 == 0 else Schedule(cron=cron, tz=tz)
        tasks.append(timer.schedule_recurring(schedule, _noop, schedule_id=str(i)))
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(timer) == n
    timer.close()
    return ScheduleResult("memory on a timer", "tickwheel", n, held / n, "bytes")


def _noop() -> None:
    pass


def run_schedules(n: int, repeat: int, memory_n: int, seed: int = 7) -> list[ScheduleResult]:
    results = _next_occurrences(n, repeat, seed)
    if memory_n:
        results.append(_memory(memory_n, seed))
    return results


def table(results: list[ScheduleResult]) -> str:
    anchor = next((r for r in results if r.impl == "croniter"), None)
    lines = ["| workload | implementation | N | result |", "|---|---|---:|---:|"]
    for r in results:
        if r.unit == "bytes":
            text = f"{r.value:,.0f} B per schedule"
        else:
            text = f"{r.value / 1e3:,.0f}k/s"
            if anchor is not None and r is not anchor and r.impl != "tickwheel, all":
                text += f" ({r.value / anchor.value:.2f}x)"
        lines.append(f"| {r.workload} | {r.impl} | {r.n:,} | {text} |")
    return "\n".join(lines)
