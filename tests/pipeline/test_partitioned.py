"""The partitioned engine: key stage, op stage and the routing between them give the
reference engine's outcomes at any partition count, and the work per event does not
grow with the count."""

from __future__ import annotations

import json
import random
from collections.abc import Generator
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.pipeline.logs import LATENESS_MS, random_log
from tests.pipeline.test_seen_log import SegmentStore
from tickwheel.pipeline.contract.events import compact_wire, is_quarantined
from tickwheel.pipeline.contract.routing import partition_of, route
from tickwheel.pipeline.engines.partitioned import run_partitioned
from tickwheel.pipeline.engines.reference import ReferenceEngine, RunResult
from tickwheel.pipeline.semantics import partition
from tickwheel.pipeline.semantics.key_stage import (
    ERROR_PROGRESS,
    INIT,
    VALUE_PROGRESS,
    KeyStage,
    key_order,
)
from tickwheel.pipeline.semantics.op_stage import OpStage, op_order
from tickwheel.pipeline.semantics.partition import KeyPartition, OpPartition, PartitionStatus
from tickwheel.pipeline.semantics.row_times import times_of
from tickwheel.pipeline.state import entry_log
from tickwheel.pipeline.state.entry_log import EntryLog
from tickwheel.pipeline.state.heads import decode_key_head, decode_op_head, encode_head
from tickwheel.pipeline.state.seen_log import SeenLog
from tickwheel.pipeline.tools.generator import GeneratorConfig, generate

T = TypeVar("T")


def reference(lines: list[str], retention: int | None = None) -> RunResult:
    engine = ReferenceEngine(lateness_ms=LATENESS_MS, dedupe_retention_ms=retention)
    engine.feed_lines(lines)
    return engine.run()


def outcomes(rows: list[Any]) -> list[tuple[Any, ...]]:
    return sorted((o.op_id, o.outcome.value, o.resolved_ms, o.latency_ms, tuple(o.keys),
                   o.error, o.skipped) for o in rows)


def quarantine(rows: list[Any]) -> list[tuple[Any, ...]]:
    return sorted((q.reason.value, q.raw, q.ts_ms) for q in rows)


def assert_same_as_reference(lines: list[str], partitions: int,
                             retention: int | None = None) -> None:
    expected = reference(lines, retention)
    got = run_partitioned(lines, partitions, retention)
    assert outcomes(got.outcomes) == outcomes(expected.outcomes)
    assert quarantine(got.quarantine) == quarantine(expected.quarantine)
    assert (got.rows_in, got.rows_applied, got.pending, got.ignored_cancels) == (
        expected.rows_in, expected.rows_applied, expected.pending, expected.ignored_cancels)


def line(**row: Any) -> str:
    return json.dumps(row, separators=(",", ":"))


def watch(ts: int, op_id: str, keys: list[str], deadline: int, condition: str,
          **extra: Any) -> str:
    return line(ts_ms=ts, type="watch", op_id=op_id, keys=keys, deadline_ms=deadline,
                condition=condition, **extra)


def update(ts: int, key: str, value: int | None = None, error: str | None = None) -> str:
    if error is not None:
        return line(ts_ms=ts, type="update", key=key, error=error)
    return line(ts_ms=ts, type="update", key=key, value=value)


# -- the same outcomes as the reference engine ----------------------------------------


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("partitions", [1, 3, 8])
@pytest.mark.parametrize("retention", [None, 300])
def test_random_logs_resolve_as_the_reference_engine_resolves_them(
        seed: int, partitions: int, retention: int | None) -> None:
    assert_same_as_reference(random_log(seed), partitions, retention)


@pytest.mark.parametrize("partitions", [1, 16])
def test_a_broker_workload_resolves_as_the_reference_engine_resolves_it(partitions: int) -> None:
    lines = [json.dumps(r, separators=(",", ":")) for r in generate(
        GeneratorConfig(events=20_000, seed=3))]
    assert_same_as_reference(lines, partitions)


_KEYS = ["a", "b", "c"]


@st.composite
def logs(draw: st.DrawFn) -> list[str]:
    """Few keys, ops and times, so that ties of every kind happen."""
    out = []
    ts = 0
    for _ in range(draw(st.integers(1, 40))):
        ts += draw(st.sampled_from([0, 0, 0, 1, 3]))
        kind = draw(st.sampled_from(["watch", "watch", "value", "value", "error", "cancel",
                                     "tick"]))
        op_id = f"op{draw(st.integers(0, 6))}"
        if kind == "watch":
            condition = draw(st.sampled_from(["all_at_least", "sum_at_least", "any_update",
                                              "none"]))
            keys = [] if condition == "none" else draw(
                st.lists(st.sampled_from(_KEYS), min_size=1, max_size=3, unique=True))
            extra: dict[str, Any] = {}
            if condition in ("all_at_least", "sum_at_least"):
                extra["targets"] = {k: draw(st.integers(-2, 8)) for k in keys}
            if condition == "sum_at_least":
                extra["min_total"] = draw(st.integers(1, 10))
            deadline = ts + draw(st.sampled_from([-1, 0, 1, 3, 10, 50]))
            out.append(watch(ts, op_id, keys, deadline, condition, **extra))
        elif kind == "value":
            out.append(update(ts, draw(st.sampled_from(_KEYS)), value=draw(st.integers(-3, 10))))
        elif kind == "error":
            out.append(update(ts, draw(st.sampled_from(_KEYS)),
                              error=draw(st.sampled_from(["E1", "E2"]))))
        elif kind == "cancel":
            out.append(line(ts_ms=ts, type="cancel", op_id=op_id))
        else:
            out.append(line(ts_ms=ts, type="tick"))
    return out


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(logs(), st.sampled_from([1, 2, 5]), st.sampled_from([None, 0, 4]))
def test_any_log_of_ties_resolves_as_the_reference_engine_resolves_it(
        lines: list[str], partitions: int, retention: int | None) -> None:
    assert_same_as_reference(lines, partitions, retention)


# -- work per event --------------------------------------------------------------------


def test_the_shuffles_carry_as_much_per_event_at_any_partition_count() -> None:
    lines = [json.dumps(r, separators=(",", ":")) for r in generate(
        GeneratorConfig(events=10_000, seed=7))]
    runs = [run_partitioned(lines, n) for n in (1, 4, 16, 64)]
    rows = [r.shuffled_rows for r in runs]
    size = [r.shuffled_bytes for r in runs]
    assert max(rows) <= 1.1 * min(rows) and max(size) <= 1.1 * min(size)
    # Each update is applied once, in one partition, however many there are.
    assert len({r.rows_applied for r in runs}) == 1
    # Row times go as runs, a few bytes for each pair of partitions in a log without
    # gaps, however many rows it has.
    assert all(r.runs_bytes <= 24 * n * n for r, n in zip(runs, (1, 4, 16, 64), strict=True))
    longer = [json.dumps(r, separators=(",", ":")) for r in generate(
        GeneratorConfig(events=40_000, seed=7))]
    assert run_partitioned(longer, 16).runs_bytes == runs[2].runs_bytes


def test_a_row_goes_to_one_partition_per_key_it_names_and_one_more() -> None:
    rows = [compact_wire(text) for text in (
        watch(1, "w", ["a", "b", "c", "d"], 9, "any_update"),
        update(1, "a", value=1),
        line(ts_ms=2, type="cancel", op_id="w"),
        line(ts_ms=3, type="tick"),
        "not json",
    )]
    by_key, by_op = route(rows, 64)
    where_key = [p for p, part in enumerate(by_key) for fields in part if fields[1] == "watch"]
    assert sorted(where_key) == sorted({partition_of(k, 64) for k in "abcd"})
    assert [p for p, part in enumerate(by_key) if rows[1] in part] == [partition_of("a", 64)]
    assert rows[0] in by_op[partition_of("w", 64)] and rows[2] in by_op[partition_of("w", 64)]
    assert rows[3] in by_op[0]
    assert rows[4] in by_op[partition_of("not json", 64)]


# -- the key stage ---------------------------------------------------------------------


def key_stage(*lines: str) -> KeyStage:
    stage = KeyStage(0, 1)
    stage.apply(sorted((compact_wire(text) for text in lines), key=key_order))
    return stage


def test_a_watch_registers_on_the_values_before_the_updates_of_its_time() -> None:
    stage = key_stage(update(1, "a", value=5),
                      watch(2, "w", ["a", "b"], 9, "sum_at_least", targets={"a": 2, "b": 0},
                            min_total=10),
                      update(2, "a", value=7))
    assert stage.drain() == [(2, INIT, "w", 2, "a", 3), (2, VALUE_PROGRESS, "w", 2, "a", 5)]


def test_an_operations_only_key_sends_progress_only_once_it_is_enough() -> None:
    stage = key_stage(watch(1, "w", ["a"], 9, "sum_at_least", targets={"a": 0}, min_total=10),
                      update(2, "a", value=4), update(3, "a", value=8), update(4, "a", value=12),
                      update(5, "a", value=20))
    assert stage.drain() == [(4, VALUE_PROGRESS, "w", 1, "a", 12)]
    assert stage.registered == 0  # settled by this key: it goes


def test_a_registration_goes_at_its_deadline() -> None:
    stage = key_stage(watch(1, "w", ["a", "b"], 5, "all_at_least", targets={"a": 1, "b": 1}))
    assert stage.registered == 2
    stage.advance_to(4)
    assert stage.registered == 2
    stage.advance_to(5)  # the operation expires at 5, before that time's updates
    assert stage.registered == 0 and not stage.registrations
    stage.apply([compact_wire(update(5, "a", value=3))])
    assert stage.drain() == []


def test_an_error_reaches_every_registration_on_its_key_once_with_the_smallest() -> None:
    stage = key_stage(watch(1, "w", ["a"], 9, "any_update"),
                      watch(1, "v", ["a", "b"], 9, "all_at_least", targets={"a": 1, "b": 1}),
                      update(3, "a", error="Z"), update(3, "a", error="B"),
                      update(4, "a", error="C"))
    assert sorted(stage.drain()) == [(3, ERROR_PROGRESS, "v", 1, "a", "B"),
                                     (3, ERROR_PROGRESS, "w", 1, "a", "B")]
    assert stage.registrations.keys() == {"b"}


def test_a_key_stage_registers_only_its_own_keys() -> None:
    keys = ["a", "b", "c", "d", "e", "f"]
    mine = [k for k in keys if partition_of(k, 2) == 1]
    stage = KeyStage(1, 2)
    stage.apply([compact_wire(watch(1, "w", keys, 9, "any_update"))])
    assert sorted(stage.registrations) == mine


# -- the op stage ----------------------------------------------------------------------


def op_stage(*rows: Any) -> OpStage:
    stage = OpStage()
    stage.apply_staged(sorted(rows, key=op_order))
    return stage


def test_progress_of_a_watch_the_op_stage_did_not_accept_is_ignored() -> None:
    first = compact_wire(watch(1, "w", ["a"], 9, "any_update"))
    duplicate = compact_wire(watch(2, "w", ["b"], 9, "any_update"))
    stage = op_stage(first, duplicate, (3, VALUE_PROGRESS, "w", 2, "b", 1))
    assert stage.pending.keys() == {"w"} and not stage.outcomes
    assert [q.reason.value for q in stage.quarantine] == ["duplicate_op_id"]
    stage.apply_staged([(4, VALUE_PROGRESS, "w", 1, "a", 1)])
    assert [(o.op_id, o.outcome.value, o.resolved_ms) for o in stage.outcomes] == [
        ("w", "completed", 4)]


def test_at_one_time_values_come_before_errors_and_errors_before_cancels() -> None:
    stage = op_stage(
        compact_wire(watch(1, "done", ["a"], 9, "any_update")),
        compact_wire(watch(1, "failed", ["a", "b"], 9, "any_update")),
        compact_wire(watch(1, "kept", ["c"], 9, "any_update")),
        (5, ERROR_PROGRESS, "done", 1, "a", "E"),
        (5, VALUE_PROGRESS, "done", 1, "a", 1),
        (5, ERROR_PROGRESS, "failed", 1, "b", "Y"),
        (5, ERROR_PROGRESS, "failed", 1, "a", "X"),
        compact_wire(line(ts_ms=5, type="cancel", op_id="failed")),
        compact_wire(line(ts_ms=5, type="cancel", op_id="kept")),
    )
    assert sorted((o.op_id, o.outcome.value, o.error) for o in stage.outcomes) == [
        ("done", "completed", None), ("failed", "error", "X"), ("kept", "cancelled", None)]
    assert stage.ignored_cancels == 1


# -- partitions behind the input's clock, micro-batch after micro-batch -------------------


class _SavedLog:
    """One partition saved as the Spark engine saves it (its head, and its entries as a
    log of chunks; its seen op ids too, for an op partition), run by one of two
    workers at a time: each keeps the copy it last ran, caught up from the log when
    the partition comes back to it, or reads the log whole the first time."""

    def __init__(self, op: bool) -> None:
        self.op = op
        self.chunks: dict[int, bytes] = {}
        self.digests: dict[int, bytes] = {}
        self.seen = SegmentStore()
        self.head = b""
        self.copies: dict[int, tuple[Any, EntryLog, SeenLog]] = {}
        self.caught_up = 0

    def save(self, part: Any, log: EntryLog, seen: SeenLog) -> None:
        changed = part.entries(part.take_changes())
        written, first, rewrite = log.record(changed, part.live_entries(), part.entries,
                                             part.entry_bytes)
        if rewrite:
            self.chunks.clear()
            self.digests.clear()
        for number, (blob, digest, _) in enumerate(written, first):
            self.chunks[number] = blob
            self.digests[number] = digest
        if isinstance(part, OpPartition):
            self.seen.write(seen, [(part.stage.take_seen_changes(), part.stage.now)],
                            part.stage.dedupe_retention_ms)
        self.head = encode_head(part.head())

    def load(self, worker: int) -> tuple[Any, EntryLog, SeenLog]:
        copy = self.copies.pop(worker, None)
        chunks = list(self.chunks.items())[::-1]  # in any order
        seen = (copy[2] if copy is not None and self.seen.catch_up(copy[2])
                else self.seen.read())
        later = (None if copy is None
                 else copy[1].catch_up(len(chunks), self.digests.get, self.chunks.__getitem__))
        if later is not None:
            assert copy is not None
            part = copy[0]
            if (part.catch_up(decode_key_head(self.head), later)
                    if isinstance(part, KeyPartition)
                    else part.catch_up(decode_op_head(self.head), later, seen.ids)):
                self.caught_up += 1
                return part, copy[1], seen
        log, held = EntryLog.read(chunks)
        restored: Any
        if self.op:
            restored = OpPartition.from_state(decode_op_head(self.head), held.items(), seen.ids)
            restored.stage.track_seen_changes()
        else:
            restored = KeyPartition.from_state(decode_key_head(self.head), held.items())
        restored.track_changes()
        return restored, log, seen

    def step(self, part: Any, log: EntryLog, seen: SeenLog, worker: int,
             next_worker: int) -> tuple[Any, EntryLog, SeenLog]:
        """Save what ``worker`` ran, and load it for ``next_worker``."""
        self.save(part, log, seen)
        self.copies[worker] = (part, log, seen)
        return self.load(next_worker)


def run_in_batches(lines: list[str], partitions: int, batches: int,
                   retention: int | None = None, save: bool = False,
                   caught_up: list[int] | None = None, alternate: bool = False,
                   ) -> tuple[list[Any], list[Any], list[PartitionStatus]]:
    """The engine's flow without Spark: each micro-batch's rows to both stages, each
    stage 1 partition told every slice's top, and the input ended after the last.
    ``save``: each partition goes through its head and the log of its entries after
    each batch, run by either of two
    workers, at random or taking turns (``alternate``); ``caught_up`` gets how often
    a worker caught its copy up."""
    keys = [KeyPartition(p, partitions, LATENESS_MS) for p in range(partitions)]
    ops = [OpPartition(p, LATENESS_MS, retention) for p in range(partitions)]
    saved = [_SavedLog(op=n >= partitions) for n in range(2 * partitions)]
    logs = [(EntryLog(), SeenLog()) for _ in range(2 * partitions)]
    workers = [0] * (2 * partitions)
    choose = random.Random(batches * 100 + partitions)
    if save:
        for part in [*keys, *ops]:
            part.track_changes()
        for part in ops:
            part.stage.track_seen_changes()
    outs: list[Any] = []
    quarantined: list[Any] = []
    size = -(-len(lines) // batches)
    for b in range(batches):
        rows = [compact_wire(text) for text in lines[b * size:(b + 1) * size] if text.strip()]
        top = max((fields[0] for fields in rows if not is_quarantined(fields)), default=None)
        by_key, by_op = route(rows, partitions)
        last = b == batches - 1
        points = []
        progress: list[list[Any]] = [[] for _ in range(partitions)]
        runs = []
        for p, part in enumerate(keys):
            quarantined.extend(part.take(by_key[p], top, times_of(by_op[p])))
            end = part.end_of_input_ms() if last else None
            point, made, released = part.release(end)
            points.append(point)
            runs.append(released)
            for row in made:
                progress[partition_of(row[2], partitions)].append(row)
        assert len(set(points)) == 1  # every partition stands at the same point
        for p, part in enumerate(ops):
            quarantined.extend(part.take(by_op[p], progress[p]))
            done, duplicates = part.release(points[p], runs)
            outs.extend(done)
            quarantined.extend(duplicates)
        if save:
            for n, ran in enumerate([*keys, *ops]):
                worker = (b + 1) % 2 if alternate else choose.randrange(2)
                part, log, seen = saved[n].step(ran, *logs[n], workers[n], worker)
                logs[n], workers[n] = (log, seen), worker
                if n < partitions:
                    keys[n] = part
                else:
                    ops[n - partitions] = part
    statuses = [part.status() for part in [*keys, *ops]]
    if caught_up is not None:
        caught_up[:] = [log.caught_up for log in saved]
    return outs, quarantined, statuses


@pytest.mark.parametrize(("seed", "partitions", "batches", "retention", "save"), [
    (1, 1, 1, None, False), (2, 3, 4, None, True), (3, 4, 7, 300, True), (4, 8, 13, None, True),
    (5, 1, 9, None, True), (6, 3, 11, 300, True), (7, 4, 17, 200, True),
    (8, 8, 13, None, True),
])
def test_micro_batches_and_saved_states_change_no_outcome(
        seed: int, partitions: int, batches: int, retention: int | None, save: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Small chunks and early rewrites, so that a log of a few hundred rows has both;
    # and the rows a partition releases handed to its stage a few at a time.
    monkeypatch.setattr(entry_log, "REWRITE_SLACK", 8)
    monkeypatch.setattr(entry_log, "CHUNK_ENTRIES", 5)
    monkeypatch.setattr(partition, "PIECE_ROWS", 3)
    lines = random_log(seed)
    expected = reference(lines, retention)
    caught_up: list[int] = []
    outs, quarantined, statuses = run_in_batches(lines, partitions, batches, retention, save,
                                                 caught_up)
    if save:
        assert sum(caught_up) > 0  # workers' older copies were caught up from the log
    assert outcomes(outs) == outcomes(expected.outcomes)
    assert quarantine(quarantined) == quarantine(expected.quarantine)
    assert sum(s.rows_in for s in statuses) == expected.rows_in
    assert sum(s.rows_applied for s in statuses) == expected.rows_applied
    assert sum(s.quarantined for s in statuses) == len(expected.quarantine)
    assert sum(s.held for s in statuses) == 0
    assert sum(s.pending for s in statuses if s.stage == "op") == expected.pending


@pytest.mark.parametrize("condition", ["all_at_least", "sum_at_least"])
def test_an_operations_progress_from_earlier_batches_survives_its_log(condition: str) -> None:
    """Each part an operation's keys gave, in batches after its watch's, is in the log:
    restored or caught up from it, the operation completes on the last part and not
    before."""
    targets = {"a": 0, "b": 0}
    lines = [watch(0, "op", ["a", "b"], 60_000, condition, targets=targets, min_total=2),
             update(5_000, "a", value=1), update(10_000, "b", value=1),
             update(15_000, "c", value=1)]
    for partitions, alternate in ((1, False), (2, False), (1, True), (2, True)):
        # Taking turns, each batch's worker catches up the copy it ran two batches ago.
        outs, _, _ = run_in_batches(lines, partitions, batches=4, save=True,
                                    alternate=alternate)
        assert outcomes(outs) == outcomes(reference(lines).outcomes)
        assert [(o.op_id, o.outcome.value, o.resolved_ms) for o in outs] == [
            ("op", "completed", 10_000)]


def test_an_id_past_its_retention_while_pending_is_judged_alike_after_its_log() -> None:
    """The log does not say that an id has passed its retention while its operation is
    pending: restored or caught up, the stage moves it apart again before it judges
    the next watch, so a copy stays a duplicate and a watch after the operation
    resolved starts a new one."""
    lines = [watch(0, "op", ["k"], 60_000, "any_update"),
             watch(2_000, "op", ["k"], 60_000, "any_update"),  # duplicate: still pending
             line(ts_ms=4_000, type="cancel", op_id="op"),
             watch(6_000, "op", ["k"], 9_000, "any_update"),  # a new operation
             watch(8_000, "op", ["k"], 9_000, "any_update"),  # its duplicate
             update(20_000, "z", value=1)]
    expected = reference(lines, retention=1_000)
    assert [q.reason.value for q in expected.quarantine] == ["duplicate_op_id"] * 2
    for alternate in (False, True):
        outs, quarantined, _ = run_in_batches(lines, 1, batches=6, retention=1_000,
                                              save=True, alternate=alternate)
        assert outcomes(outs) == outcomes(expected.outcomes)
        assert quarantine(quarantined) == quarantine(expected.quarantine)


def test_a_pending_operation_whose_ids_segment_went_stays_a_duplicate_after_its_log() -> None:
    """The seen ids' segment that held the id of a pending operation goes once the id is
    past its retention; read back or caught up, the partition still takes a copy of
    the watch as a duplicate while the operation is pending."""
    lines = [watch(0, "op", ["k"], 60_000, "any_update"),
             watch(5_000, "other", ["j"], 60_000, "any_update"),  # the segment of op goes
             watch(8_000, "op", ["k"], 60_000, "any_update"),  # a copy: op is pending
             update(20_000, "z", value=1)]
    expected = reference(lines, retention=1_000)
    assert [q.reason.value for q in expected.quarantine] == ["duplicate_op_id"]
    for alternate in (False, True):
        # Taking turns, the second batch reads the log whole, the third catches a copy up.
        outs, quarantined, _ = run_in_batches(lines, 1, batches=4, retention=1_000,
                                              save=True, alternate=alternate)
        assert outcomes(outs) == outcomes(expected.outcomes)
        assert quarantine(quarantined) == quarantine(expected.quarantine)


def test_a_batch_saves_what_it_changed_but_not_what_came_and_went_within_it() -> None:
    """An entry added and gone between two saves was never saved, so it is left out of
    the changes; one saved earlier and gone since is written as gone."""
    keys, ops = KeyPartition(0, 1, 0), OpPartition(0, 0)
    keys.track_changes()
    ops.track_changes()

    def batch(*lines: str) -> tuple[dict[Any, Any], dict[Any, Any]]:
        rows = sorted((compact_wire(text) for text in lines), key=key_order)
        keys.take(rows, max(r[0] for r in rows))
        point, made, _ = keys.release()
        ops.take([r for r in rows if r[1] != "update"], made)
        ops.release(point)
        return dict(keys.entries(keys.take_changes())), dict(ops.entries(ops.take_changes()))

    # Each batch ends with a row on "z" at a later time, which moves its point past the rest.
    key_changes, op_changes = batch(watch(1, "kept", ["a"], 900, "any_update"),
                                    watch(1, "brief", ["b"], 900, "any_update"),
                                    update(2, "b", value=1), update(5, "z", value=1))
    assert set(op_changes) == {"kept"} and op_changes["kept"] is not None
    assert set(key_changes) == {"b", ("a", "kept", 1)}  # b's value, not brief's registration
    key_changes, op_changes = batch(update(6, "a", value=1),
                                    watch(6, "kept", ["a"], 900, "any_update"),  # a new one
                                    update(7, "a", value=2), update(9, "z", value=2))
    assert op_changes == {"kept": None}  # gone: saved before, resolved twice since
    assert key_changes == {"a": 2, "z": 1, ("a", "kept", 1): None}


def _yields(steps: Generator[None, None, T]) -> tuple[int, T]:
    """How many times a release's steps yield, and their value."""
    count = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return count, done.value
        count += 1


def test_a_release_yields_only_between_two_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each stage's steps yield once between two pieces they apply (ten rows at ten
    times, in pieces of four: twice), not before the first or after the last, and not
    at all for a release of one piece; the value is what release() gives."""
    monkeypatch.setattr(partition, "PIECE_ROWS", 4)
    keys, ops = KeyPartition(0, 1, 0), OpPartition(0, 0)
    keys.take([compact_wire(update(ts, f"k{ts}", value=ts)) for ts in range(10)], 9)
    yields, (point, _, _) = _yields(keys.release_steps(end_ms=10))
    assert (yields, point) == (2, 10)
    ops.take([compact_wire(watch(ts, f"w{ts}", [], 20, "none")) for ts in range(10)], [])
    assert _yields(ops.release_steps(10))[0] == 2
    ops.take([compact_wire(watch(11, "one", [], 30, "none"))], [])
    yields, (done, _) = _yields(ops.release_steps(25))
    assert yields == 0
    assert sorted(o.op_id for o in done) == [f"w{ts}" for ts in range(10)]  # at 20


def test_a_release_in_one_go_applies_what_its_steps_apply() -> None:
    rows = [compact_wire(watch(i // 15, f"w{i}", [], 22, "none")) for i in range(300)]
    stepped, whole = OpPartition(0, 0), OpPartition(0, 0)
    stepped.take(list(rows), [])
    whole.take(list(rows), [])
    _, (by_steps, _) = _yields(stepped.release_steps(25))
    at_once, _ = whole.release(25)
    assert sorted(o.op_id for o in by_steps) == sorted(o.op_id for o in at_once)
    assert len(at_once) == 300


def test_a_row_below_the_point_time_has_reached_is_late_in_the_stage_that_owns_it() -> None:
    keys, ops = KeyPartition(0, 1, 10), OpPartition(0, 10)
    on_time = compact_wire(update(100, "a", value=1))
    keys.take([on_time], 100)
    point, _, _ = keys.release()
    assert point == 90
    late_update = compact_wire(update(50, "a", value=2))
    late_watch = compact_wire(watch(50, "w", ["a"], 99, "any_update"))
    assert [q.reason.value for q in keys.take([late_update, late_watch], 100)] == ["late"]
    assert keys.held == [on_time]  # the watch's copy goes; stage 2 quarantines the watch
    ops.release(point)
    assert [q.reason.value for q in ops.take([late_watch], [])] == ["late"]


def test_a_resolved_operation_can_be_forgotten_before_its_deadline() -> None:
    stage = key_stage(watch(10, "a", ["k0", "k1"], 500, "any_update"),
                      watch(10, "b", ["k0"], 500, "any_update"))
    assert stage.registered == 3
    stage.forget("a", 10, ["k0", "k1"])
    assert stage.registered == 1 and set(stage.registrations) == {"k0"}
    stage.forget("a", 10, ["k0"])  # twice: nothing more
    assert stage.registered == 1


def test_forgotten_registrations_leave_the_deadlines_and_the_snapshot() -> None:
    stage = key_stage(*(watch(10, f"op-{i}", ["k0"], 10_000 + i, "any_update")
                        for i in range(3_000)))
    assert len(stage.deadlines_list()) == 3_000
    for i in range(2_990):
        stage.forget(f"op-{i}", 10, ["k0"])
    assert stage.registered == 10
    assert [entry[2] for entry in sorted(stage.deadlines_list())] == [
        f"op-{i}" for i in range(2_990, 3_000)]
    assert len(stage._deadlines) <= 2 * 10 + 1024  # the heap was rebuilt, not just read
    stage.advance_to(20_000)  # the live ones still go at their deadlines
    assert stage.registered == 0 and not stage.registrations


def test_a_partition_gives_persistence_its_changes_once() -> None:
    watch = ('{"ts_ms": 5, "type": "watch", "op_id": "a", "keys": ["k"], "deadline_ms": 50, '
             '"condition": "any_update"}')
    ops = OpPartition(0, LATENESS_MS, dedupe_retention_ms=None)
    ops.track_changes()
    ops.stage.track_seen_changes()
    ops.take([compact_wire(watch)], [])
    ops.release(10)
    changes = ops.changes()
    assert changes.head == ops.head()
    assert [op_id for op_id, _ in changes.entries] == ["a"] and changes.seen == [("a", 5)]
    again = ops.changes()
    assert (again.entries, again.seen) == ([], [])  # taken: the next commit writes none
    keys = KeyPartition(0, 1, LATENESS_MS)
    keys.track_changes()
    assert keys.changes().seen == []  # a key partition sees no op ids
