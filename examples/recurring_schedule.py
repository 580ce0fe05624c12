"""Recurring schedules in-process: a nightly job in Shanghai time and a morning one in
London, on a timing wheel, across the day Europe's clocks go forward.

The clock is a manual one that reads wall time (epoch milliseconds), so a simulated
week runs in an instant; give the timer no clock to run on the real one.

    python examples/recurring_schedule.py [--days N]
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from tickwheel import ManualClock, Schedule, TimingWheelTimer

START_MS = 1_774_569_600_000  # 2026-03-27T00:00Z: Europe's clocks go forward on the 29th


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=3)
    args = parser.parse_args()
    clock = ManualClock(START_MS)
    fired: list[tuple[str, int]] = []
    with TimingWheelTimer(clock=clock, executor=None) as timer:
        def run(name: str) -> None:
            fired.append((name, clock.now_ms()))

        timer.schedule_recurring(Schedule(cron="0 2 * * *", tz="Asia/Shanghai"), run,
                                 "earnings", schedule_id="earnings")
        timer.schedule_recurring(Schedule(cron="0 9 * * *", tz="Europe/London"), run,
                                 "coupons", schedule_id="coupons")
        for _ in range(args.days * 24 * 60):  # a minute at a time
            clock.advance(60_000)
            timer.advance_clock(0)
    for name, at in fired:
        when = datetime.fromtimestamp(at / 1000, UTC).strftime("%a %Y-%m-%d %H:%M UTC")
        print(f"{when}  {name}")


if __name__ == "__main__":
    main()
