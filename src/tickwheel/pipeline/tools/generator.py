"""Workloads for the pipeline: the broker models, driven on a simulated clock, write
the event log.

Replicated partitions take acks=all produces (some followers are slow; now and then a
leader moves away and back, or a partition disappears); followers and consumers fetch
with min bytes; consumer groups heartbeat and some members crash, so their sessions
expire; plain tasks are scheduled and some cancelled. Every delayed operation the
models create becomes a ``watch`` row; what can complete it becomes ``update`` rows:

====================  ==============  ==========================================
operation             condition       keys (values)
====================  ==============  ==========================================
DelayedProduce        all_at_least    partition (its high watermark)
DelayedFetch          sum_at_least    ``<partition>:leo_bytes`` for followers,
                                      ``<partition>:hw_bytes`` for consumers
                                      (bytes of the log up to that offset)
DelayedHeartbeat      any_update      ``<group>/<member>`` (a liveness signal)
scheduled task        none            (none)
====================  ==============  ==========================================

With ``schedules``, the log also holds that many recurring schedules, written at its
start (intervals, and cron specs in several zones), some paused and resumed later.

A leader change or a deleted partition becomes an ``update`` with an ``error`` on the
partition and its byte keys. Seeded: the same arguments give the same log.
"""

from __future__ import annotations

import gzip as gzip_module
import heapq
import itertools
import json
import random
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tickwheel._clock import ManualClock
from tickwheel.broker import BrokerListener
from tickwheel.broker.groups import DelayedHeartbeat, GroupCoordinator
from tickwheel.broker.replication import CONSUMER, DelayedFetch, DelayedProduce, ReplicaManager
from tickwheel.pipeline.io.files import write_bytes_atomically
from tickwheel.purgatory import DelayedOperation

__all__ = ["GeneratorConfig", "follow_event_log", "generate", "iter_rows", "write_event_log"]


@dataclass(frozen=True)
class GeneratorConfig:
    events: int = 100_000
    seed: int = 1
    partitions: int = 12
    groups: int = 4
    members_per_group: int = 6
    malformed_fraction: float = 0.0  # extra malformed rows, as a fraction of events
    disorder_ms: int = 0  # rows may be written up to this much out of ts order
    rows_per_file: int = 20_000
    #: Simulated time per step of the models: shorter steps make more events per second
    #: of ``ts_ms`` (each step produces and fetches; per-second work stays per second).
    step_us: int = 10_000
    #: Recurring schedules in the log (``schedule`` rows at its start).
    schedules: int = 0


#: The specs the generator's schedules take, in turn: intervals, and cron in zones
#: with and without daylight saving, a 30-minute shift and seconds.
_SCHEDULE_SPECS: list[dict[str, Any]] = [
    {"every_ms": 1_000},
    {"every_ms": 15_000, "jitter_ms": 2_000},
    {"cron": "* * * * *", "tz": "America/New_York"},
    {"every_ms": 5_000, "anchor_ms": 1_250, "misfire": "all"},
    {"cron": "*/10 * * * * *", "tz": "Asia/Kolkata", "jitter_ms": 500},
    {"cron": "*/30 * * * * *", "tz": "Australia/Lord_Howe", "misfire": "skip"},
    {"every_ms": 60_000, "max_runs": 3},
    {"cron": "0 * * * *", "tz": "Europe/London"},
]


def _schedule_rows(config: GeneratorConfig, rng: random.Random,
                   ) -> Iterator[tuple[int, dict[str, Any]]]:
    """(second, row): the schedules at second 0, and now and then a pause or a resume
    of one of them (a seeded stream of its own, so the models' rows do not change)."""
    if config.schedules < 1:
        return
    for n in range(config.schedules):
        yield 0, {"type": "schedule", "schedule_id": f"job-{n}",
                  **_SCHEDULE_SPECS[n % len(_SCHEDULE_SPECS)]}
    paused: set[int] = set()
    for second in itertools.count(1):
        if rng.random() < 0.2:
            n = rng.randrange(config.schedules)
            kind = "resume" if n in paused else "pause"
            paused.symmetric_difference_update({n})
            yield second, {"type": kind, "schedule_id": f"job-{n}"}


class _LogWriter(BrokerListener):
    """Turns what the models do into rows."""

    def __init__(self, clock: ManualClock, manager: ReplicaManager) -> None:
        self.clock = clock
        self.manager = manager
        self.rows: list[dict[str, Any]] = []
        self._next = 0

    def _row(self, **fields: Any) -> None:
        self.rows.append({"ts_ms": self.clock.now_ms(), **fields})

    def _op_id(self, op: DelayedOperation, kind: str) -> str:
        self._next += 1
        return f"{kind}-{self._next}"

    def byte_position(self, partition: str, offset: int) -> int:
        return self.manager.partitions[partition].log.bytes_between(0, offset)

    def produce_appended(self, partition: str, first_offset: int, last_offset: int,
                         size_bytes: int) -> None:
        log = self.manager.partitions[partition].log
        self._row(type="update", key=f"{partition}:leo_bytes",
                  value=log.bytes_between(0, log.log_end_offset))

    def high_watermark_moved(self, partition: str, high_watermark: int) -> None:
        self._row(type="update", key=partition, value=high_watermark)
        self._row(type="update", key=f"{partition}:hw_bytes",
                  value=self.byte_position(partition, high_watermark))

    def heartbeat(self, group_id: str, member_id: str) -> None:
        self._row(type="update", key=f"{group_id}/{member_id}", value=self.clock.now_ms())

    def operation_watched(self, op: DelayedOperation, keys: tuple[Hashable, ...]) -> None:
        deadline = op.expiration_ms
        if isinstance(op, DelayedProduce):
            targets = {p: s.required_offset for p, s in op.statuses.items() if s.acks_pending}
            self._row(type="watch", op_id=self._op_id(op, "produce"), keys=list(targets),
                      deadline_ms=deadline, condition="all_at_least", targets=targets)
        elif isinstance(op, DelayedFetch):
            suffix = "leo_bytes" if op.from_follower else "hw_bytes"
            starts = {f"{p}:{suffix}": self.byte_position(p, s.start.message_offset)
                      for p, s in op.statuses.items()}
            kind = "follower-fetch" if op.from_follower else "fetch"
            self._row(type="watch", op_id=self._op_id(op, kind), keys=list(starts),
                      deadline_ms=deadline, condition="sum_at_least", targets=starts,
                      min_total=op.min_bytes)
        elif isinstance(op, DelayedHeartbeat):
            # The model starts the next session after the heartbeat that ended the last
            # one; in the log a watch comes before the updates of its ts_ms, so the
            # session starts 1 ms later or that same heartbeat would complete it.
            key = f"{op.group.group_id}/{op.member.member_id}"
            self.rows.append({"ts_ms": self.clock.now_ms() + 1, "type": "watch",
                              "op_id": self._op_id(op, "session"), "keys": [key],
                              "deadline_ms": deadline, "condition": "any_update"})

    def task(self, delay_ms: int) -> str:
        self._next += 1
        op_id = f"task-{self._next}"
        self._row(type="watch", op_id=op_id, keys=[], deadline_ms=self.clock.now_ms() + delay_ms,
                  condition="none")
        return op_id

    def partition_error(self, partition: str, error: str) -> None:
        for key in (partition, f"{partition}:leo_bytes", f"{partition}:hw_bytes"):
            self._row(type="update", key=key, error=error)


def generate(config: GeneratorConfig) -> list[dict[str, Any]]:
    """The rows of one workload, in the order they happened."""
    return list(iter_rows(config))


def iter_rows(config: GeneratorConfig) -> Iterator[dict[str, Any]]:
    """The rows of one workload, in the order they happened, as the models make them:
    the models' memory does not grow with ``config.events``."""
    if config.events < 1:
        raise ValueError(f"events must be >= 1, got {config.events}")
    if not 1 <= config.step_us <= 1_000_000:
        raise ValueError(f"step_us must be in 1..1000000, got {config.step_us}")
    per_second = max(1, round(1_000_000 / config.step_us))
    rng = random.Random(config.seed)
    clock = ManualClock(1_000_000)
    # Readers fetch near the log's end, so 64 segments more than cover every offset the
    # log rows ask about, and a long workload keeps only those.
    manager = ReplicaManager(clock=clock, replica_lag_time_max_ms=5_000, segment_bytes=64_000,
                             retention_bytes=64 * 64_000)
    writer = _LogWriter(clock, manager)
    manager.listener = writer
    coordinator = GroupCoordinator(clock=clock, listener=writer)
    partitions = [f"t{i // 4}-{i % 4}" for i in range(config.partitions)]
    for p in partitions:
        manager.create_partition(p, replicas=[0, 1, 2])
    slow = {p: rng.random() < 0.25 for p in partitions}  # one follower of these lags
    members: dict[str, str] = {}
    for g in range(config.groups):
        name = f"g{g}"
        for _ in range(config.members_per_group):
            members[coordinator.join_group(name, None, session_timeout_ms=6_000)] = name
        coordinator.sync_group(name, next(m for m, gg in members.items() if gg == name))
    alive = set(members)
    schedules = _schedule_rows(config, random.Random(config.seed + 2))
    next_schedule = next(schedules, None)
    tasks: list[str] = []
    moved: dict[str, int] = {}  # partition -> ms until its leader comes back
    step = 0
    emitted = 0
    while emitted < config.events:
        step += 1
        # Whole milliseconds, spread evenly: the clock is at step * step_us, rounded down.
        advance = step * config.step_us // 1000 - (step - 1) * config.step_us // 1000
        clock.advance(advance)
        live = [p for p in partitions if p in manager.partitions]
        for _ in range(rng.randint(0, 3)):  # acks=all produces
            chosen = rng.sample(live, k=min(len(live), rng.randint(1, 2)))
            manager.append_records({p: [rng.randint(50, 900)] for p in chosen}, -1,
                                   rng.choice([500, 2_000, 30_000]), lambda _r: None)
        for p in live:  # followers fetch; a slow one only now and then
            if not manager.partitions[p].is_leader:
                continue
            for r in (1, 2):
                if r == 2 and slow[p] and rng.random() < 0.97:
                    continue
                if rng.random() < 0.5:
                    leo = manager.partitions[p].log.log_end_offset
                    manager.fetch(r, {p: leo}, rng.choice([1, 1_000]), 1 << 20,
                                  rng.choice([0, 500]), lambda _r: None)
        if rng.random() < 0.3 and live:  # consumers
            chosen = rng.sample(live, k=min(len(live), 2))
            offsets = {p: max(0, manager.partitions[p].high_watermark.message_offset
                              - rng.randint(0, 3)) for p in chosen}
            manager.fetch(CONSUMER, offsets, rng.choice([500, 2_000, 5_000]), 1 << 20,
                          rng.choice([300, 1_000]), lambda _r: None)
        if step % per_second == 0:  # every second: heartbeats, crashes, rebalances
            for m in sorted(alive):
                if rng.random() < 0.01:
                    alive.discard(m)  # crashed: its session will expire
                elif rng.random() < 0.35:
                    coordinator.heartbeat(members[m], m)
            for group_id in sorted({members[m] for m in members}):
                group = coordinator.groups.get(group_id)
                if group is not None and group.rebalancing:
                    back = sorted(m for m in alive
                                  if members[m] == group_id and m in group.members)
                    for m in back:
                        coordinator.join_group(group_id, m, session_timeout_ms=6_000)
                    if back:
                        coordinator.sync_group(group_id, back[0])
            for _ in range(rng.randint(0, 2)):  # new members join now and then
                group_id = f"g{rng.randrange(config.groups)}"
                member_id = coordinator.join_group(group_id, None, session_timeout_ms=6_000)
                members[member_id] = group_id
                alive.add(member_id)
        if rng.random() < 0.05:  # plain scheduled tasks, some cancelled
            tasks.append(writer.task(rng.randint(100, 20_000)))
            if len(tasks) > _TASKS_KEPT:  # long past their deadlines: cancels go nowhere
                del tasks[:len(tasks) - _TASKS_KEPT // 2]
        if tasks and rng.random() < 0.02:
            writer._row(type="cancel", op_id=tasks.pop(rng.randrange(len(tasks))))
        if rng.random() < 0.002 and live:  # a leader moves away, and back later
            p = rng.choice(live)
            if manager.partitions[p].is_leader:
                writer.partition_error(p, "NOT_LEADER_OR_FOLLOWER")
                manager.change_leader(p, 1)
                moved[p] = 2_000
        for p in list(moved):
            moved[p] -= advance
            if moved[p] <= 0:
                del moved[p]
                if p in manager.partitions:
                    manager.change_leader(p, 0)
        if step == 30 * per_second and len(live) > 4:  # one partition is deleted
            victim = live[-1]
            writer.partition_error(victim, "UNKNOWN_TOPIC_OR_PARTITION")
            manager.delete_partition(victim)
        if step % per_second == per_second // 2:
            writer._row(type="tick")
        if step % per_second == 1 % per_second:  # the schedules' rows, a second at a time
            while next_schedule is not None and next_schedule[0] <= step // per_second:
                writer._row(**next_schedule[1])
                next_schedule = next(schedules, None)
        manager.advance_clock(0)
        coordinator.advance_clock(0)
        rows, writer.rows = writer.rows[:config.events - emitted], []
        emitted += len(rows)
        yield from rows
    manager.close()
    coordinator.close()


#: Task ids a workload may still cancel; older ones go. A cancel of a task long past
#: its deadline is ignored by the engines anyway.
_TASKS_KEPT = 100_000




_MALFORMED = [
    "{not json",
    '["a", "list"]',
    '{"type": "tick"}',
    '{"ts_ms": "soon", "type": "tick"}',
    '{"ts_ms": 5, "type": "explode"}',
    '{"ts_ms": 5, "type": "update", "key": "k", "value": 1.5}',
    '{"ts_ms": 5, "type": "update", "key": "k", "value": 1, "error": "E"}',
    '{"ts_ms": 5, "type": "watch", "op_id": "x", "keys": ["k"], "deadline_ms": 9, '
    '"condition": "eventually"}',
    '{"ts_ms": 5, "type": "cancel", "op_id": "x", "op_id": "y"}',
]
_MALFORMED_SET = frozenset(_MALFORMED)


def _lines(config: GeneratorConfig) -> Iterator[str]:
    """The log's lines: the rows, moved by up to ``disorder_ms`` and with malformed rows
    among them if asked. Streamed, in memory bounded by the disorder window."""
    rng = random.Random(config.seed + 1)
    rows = iter_rows(config)
    if config.disorder_ms > 0:
        rows = _disordered(rows, config.disorder_ms, rng)
    lines = (json.dumps(r, separators=(",", ":")) for r in rows)
    total_rows = config.events
    malformed = int(total_rows * config.malformed_fraction)
    # Each of the malformed rows lands at a uniformly random place: selection sampling
    # (Knuth's Algorithm S) picks the places as the lines stream by.
    slots, left = total_rows + malformed, malformed
    while slots:
        if left and rng.random() * slots < left:
            left -= 1
            yield rng.choice(_MALFORMED)
        else:
            yield next(lines)
        slots -= 1


def _disordered(rows: Iterator[dict[str, Any]], disorder_ms: int,
                rng: random.Random) -> Iterator[dict[str, Any]]:
    """Each row moves by a random delay below ``disorder_ms``, and rows go out in order
    of their moved times (ties in model order), so every row stays within
    ``disorder_ms`` of its place. The models' clock never goes back, so a row whose
    moved time is before the latest row's time can go."""
    held: list[tuple[int, int, dict[str, Any]]] = []
    for seq, row in enumerate(rows):
        now = int(row["ts_ms"])
        heapq.heappush(held, (now + rng.randrange(disorder_ms), seq, row))
        # Rows come at most 1 ms before the clock (a session's watch is 1 ms after it).
        while held and held[0][0] < now - 1:
            yield heapq.heappop(held)[2]
    while held:
        yield heapq.heappop(held)[2]


def write_event_log(config: GeneratorConfig, directory: Path,
                    on_rows: Callable[[int], None] | None = None, *,
                    gzip: bool = False,
                    stop: threading.Event | None = None) -> dict[str, int]:
    """Write the workload as JSON Lines files ``events-00001.jsonl``, ... in time order
    (with bounded disorder and malformed rows if asked); return counts. ``gzip`` writes
    them gzip'd, as ``events-00001.jsonl.gz``, ...

    Rows stream to the files as the models make them, so memory does not grow with
    ``config.events``. Each file is written whole under a hidden name, then renamed into
    place: an interrupted run leaves whole files only (the engines skip hidden names).
    ``on_rows(n)`` is told of every ``n`` rows written (progress); once ``stop`` is set,
    no file is begun."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = _lines(config)
    rows = malformed = files = 0
    while stop is None or not stop.is_set():
        batch = list(itertools.islice(lines, config.rows_per_file))
        if not batch:
            break
        files += 1
        rows += len(batch)
        malformed += sum(1 for line in batch if line in _MALFORMED_SET)
        name = f"events-{files:05d}.jsonl" + (".gz" if gzip else "")
        _land(directory / name, batch)
        if on_rows is not None:
            on_rows(len(batch))
    return {"rows": rows, "malformed": malformed, "files": files}


#: Events per second of ``ts_ms`` made by each step per second (the produces and
#: fetches of one step), and by the per-second work (heartbeats, rebalances), for the
#: default models, counted at ``step_us`` 10,000 and 2,000 (docs/pipeline.md#the-generator).
_EVENTS_PER_STEP = 10.0
_EVENTS_PER_SECOND = 222.0
MIN_RATE = 250
MAX_RATE = 100_000


def step_us_for(rate: int) -> int:
    """The ``step_us`` that makes about ``rate`` events per second of ``ts_ms``."""
    if not MIN_RATE <= rate <= MAX_RATE:
        raise ValueError(f"rate must be in {MIN_RATE}..{MAX_RATE} events/s, got {rate}")
    return max(1, min(1_000_000, round(1e6 * _EVENTS_PER_STEP / (rate - _EVENTS_PER_SECOND))))


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def follow_event_log(config: GeneratorConfig, directory: Path, rate: int,
                     stop: threading.Event, *, file_ms: int = 1_000,
                     clock: Callable[[], int] = _wall_ms,
                     on_file: Callable[[int, int], None] | None = None,
                     gzip: bool = False) -> dict[str, int]:
    """Write the workload as it happens, until ``stop`` is set: about ``rate`` events
    per second with wall-clock ``ts_ms`` (epoch milliseconds; deadlines move with
    them), in a file per ``file_ms`` of time, each written whole once its last row's
    time has passed, then renamed into place (``events-<first ms>.jsonl``, in time
    order). ``config.events`` is ignored; ``config.malformed_fraction`` of the rows,
    on average, are malformed. ``on_file(rows, behind_ms)`` is told of every file:
    how many rows, and how long after its time it was written (the models falling
    behind the clock show there). ``gzip`` writes the files gzip'd (``.jsonl.gz``).
    Returns counts."""
    if not 1 <= file_ms <= 3_600_000:
        raise ValueError(f"file_ms must be in 1..3600000, got {file_ms}")
    config = replace(config, events=2**62, step_us=step_us_for(rate))
    rng = random.Random(config.seed + 1)
    rows = iter_rows(config)
    if config.disorder_ms > 0:
        rows = _disordered(rows, config.disorder_ms, rng)
    bad = config.malformed_fraction / (1 + config.malformed_fraction)
    directory.mkdir(parents=True, exist_ok=True)
    counts = {"rows": 0, "malformed": 0, "files": 0}
    offset: int | None = None
    window_end = 0
    lines: list[str] = []
    for row in rows:
        if offset is None:
            now = clock()
            offset = now - int(row["ts_ms"])
            window_end = now - now % file_ms + file_ms
        ts = int(row["ts_ms"]) + offset
        while ts >= window_end:
            wait_ms = window_end - clock()
            if (wait_ms > 0 and stop.wait(wait_ms / 1000)) or stop.is_set():
                return counts
            if lines:  # a quiet window leaves no file
                name = f"events-{window_end - file_ms:013d}.jsonl" + (".gz" if gzip else "")
                _land(directory / name, lines)
                counts["files"] += 1
                counts["rows"] += len(lines)
            if on_file is not None:
                on_file(len(lines), max(0, clock() - window_end))
            lines = []
            window_end += file_ms
        row["ts_ms"] = ts
        if "deadline_ms" in row:
            row["deadline_ms"] = int(row["deadline_ms"]) + offset
        if bad and rng.random() < bad:
            lines.append(rng.choice(_MALFORMED))
            counts["malformed"] += 1
        lines.append(json.dumps(row, separators=(",", ":")))
    return counts  # pragma: no cover - the models never run out


def _land(target: Path, lines: list[str]) -> None:
    """Written whole under a hidden name, then renamed: no reader sees half a file."""
    data = "".join(f"{line}\n" for line in lines).encode()
    if target.suffix == ".gz":
        # mtime 0: the same seed makes the same bytes, as it does uncompressed.
        data = gzip_module.compress(data, compresslevel=6, mtime=0)
    write_bytes_atomically(data, target)
