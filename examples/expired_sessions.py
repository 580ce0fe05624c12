"""Expired consumer sessions, dispatched in batches to a flaky notifier.

A group coordinator (on a simulated clock) keeps 2,000 members' sessions; every second
of simulated time some members crash and stop heartbeating. Each expired session
becomes a task for a batching dispatcher (on the real clock), whose processor
"notifies" downstream in batches and now and then answers CONGESTION, so the batch is
retried after the traffic shaper's delay. At the end every expiry has been delivered
exactly once, and the counters say what it took.

    python examples/expired_sessions.py [--members N] [--seconds S]
"""

from __future__ import annotations

import argparse
import random
import threading
import time

from tickwheel import ManualClock, ProcessingResult, create_batching_dispatcher
from tickwheel.broker import BrokerListener
from tickwheel.broker.groups import GroupCoordinator


class Notifier:
    """Delivers batches downstream; one call in ten reports congestion."""

    def __init__(self, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.delivered: list[str] = []
        self.lock = threading.Lock()

    def process(self, task: str) -> ProcessingResult:
        return self.process_batch([task])

    def process_batch(self, tasks: list[str]) -> ProcessingResult:
        with self.lock:
            if self.rng.random() < 0.1:
                return ProcessingResult.CONGESTION
            self.delivered.extend(tasks)
        return ProcessingResult.SUCCESS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=2_000)
    parser.add_argument("--seconds", type=int, default=60, help="simulated seconds")
    args = parser.parse_args(argv)

    notifier = Notifier()
    dispatcher = create_batching_dispatcher(
        "expired-sessions", notifier, max_batch_size=100, worker_count=4,
        max_batching_delay_ms=20, congestion_retry_delay_ms=30)

    class Forward(BrokerListener):
        def member_expired(self, group_id: str, member_id: str) -> None:
            # The member id is the task id: a redelivered expiry overrides, never doubles.
            dispatcher.process(member_id, f"{group_id}/{member_id}",
                               expiry_ms=int(time.monotonic() * 1000) + 60_000)

    clock = ManualClock(0)
    coordinator = GroupCoordinator(clock=clock, listener=Forward())
    rng = random.Random(7)
    groups = [f"group-{i}" for i in range(20)]
    members = {}
    for i in range(args.members):
        group = groups[i % len(groups)]
        members[coordinator.join_group(group, None, session_timeout_ms=10_000)] = group
    for group in groups:
        first = next(m for m, g in members.items() if g == group)
        coordinator.sync_group(group, first)
    alive = set(members)
    for second in range(1, args.seconds + 1):
        for crashed in rng.sample(sorted(alive), k=min(len(alive), len(members) // 100)):
            alive.discard(crashed)
        for step in range(10):  # 100 ms steps; members heartbeat every 3 s
            clock.advance(100)
            if step == 0 and second % 3 == 0:
                for m in alive:
                    coordinator.heartbeat(members[m], m)
            coordinator.advance_clock(0)
        for group in groups:  # survivors rejoin; the sync removes who did not
            if coordinator.groups[group].rebalancing:
                survivors = [m for m in alive if members[m] == group
                             and m in coordinator.groups[group].members]
                for m in survivors:
                    coordinator.join_group(group, m, session_timeout_ms=10_000)
                if survivors:
                    coordinator.sync_group(group, survivors[0])

    failed = coordinator.expired_members + coordinator.removed_on_rebalance
    deadline = time.monotonic() + 30
    while len(notifier.delivered) < failed and time.monotonic() < deadline:
        time.sleep(0.01)
    stats = dispatcher.stats()
    left = dispatcher.close()
    delivered = len(notifier.delivered)
    print(f"members {len(members):,}, crashed {len(members) - len(alive):,}: "
          f"sessions expired {coordinator.expired_members:,}, removed for not rejoining "
          f"{coordinator.removed_on_rebalance:,}, rebalances {coordinator.rebalances:,}")
    print(f"dispatcher: delivered {delivered:,} in {stats.batch_size.count:,} batches "
          f"(mean {stats.batch_size.mean:.0f}), congestion retries {stats.batches['congestion']}"
          f" ({stats.replayed:,} tasks replayed), still pending {left}")
    exact = delivered == failed == len(set(notifier.delivered))
    print("every expiry delivered exactly once" if exact else "MISMATCH")
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
