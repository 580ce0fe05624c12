"""The resolver: the semantics as a stream, in pieces, kept between micro-batches."""

from __future__ import annotations

import pickle
import random
from collections.abc import Iterator

import pytest

from tests.pipeline.logs import random_log
from tickwheel.pipeline.contract.events import Event, event_from_wire, parse_line, to_wire
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.engines.reference import ReferenceEngine
from tickwheel.pipeline.semantics.resolver import Resolver, order_key, wire_order
from tickwheel.pipeline.tools.generator import GeneratorConfig, generate


def workload(seed: int) -> list[str]:
    import json
    return [json.dumps(r) for r in generate(GeneratorConfig(events=4_000, seed=seed))]


def as_set(outcomes: list[OutcomeRow]) -> set[OutcomeRow]:
    assert len(set(outcomes)) == len(outcomes), "an outcome appeared twice"
    return set(outcomes)


class Saved:
    """A resolver saved as the engines save an op stage's: its head, its operations'
    entries and the log of its seen ids' changes, through a pickle."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}  # the changes applied in order

    def through(self, resolver: Resolver) -> Resolver:
        for op_id, ts in resolver.take_seen_changes():
            self.seen.pop(op_id, None)
            if ts is not None:
                self.seen[op_id] = ts
        head, entries = pickle.loads(pickle.dumps(
            (resolver.head(), [resolver.op_entry(op_id) for op_id in resolver.entry_ids()])))
        restored = Resolver.restore_ops(head, entries, dict(self.seen))
        restored.track_seen_changes()
        return restored


def micro_batches(events: list[Event], rng: random.Random,
                  most: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of pieces of up to about ``most`` events, each ending between
    two timestamps, as a micro-batch does."""
    i = 0
    while i < len(events):
        j = min(len(events), i + rng.randrange(1, most))
        while j < len(events) and events[j].ts_ms == events[j - 1].ts_ms:
            j += 1
        yield i, j
        i = j


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_log_applied_in_pieces_resolves_as_in_one_go(seed: int) -> None:
    lines = workload(seed)
    reference = ReferenceEngine(lateness_ms=10**12)
    reference.feed_lines(lines)
    expected = reference.run()

    events = sorted((e for e in map(parse_line, lines) if isinstance(e, Event)), key=order_key)
    rng = random.Random(seed)
    resolver = Resolver()
    outcomes: list[OutcomeRow] = []
    for i, j in micro_batches(events, rng, 400):
        # Time then moves to just before the next timestamp (the watermark).
        resolver.apply(events[i:j])
        if j < len(events):
            resolver.advance_to(events[j].ts_ms - rng.randrange(0, 2))
        done, _ = resolver.drain()
        outcomes.extend(done)
    assert as_set(outcomes) == as_set(expected.outcomes)
    assert len(resolver.pending) == expected.pending
    assert resolver.ignored_cancels == expected.ignored_cancels
    assert resolver.applied == expected.rows_applied


def test_a_later_watch_of_a_seen_op_id_is_a_duplicate_even_across_a_save() -> None:
    first = parse_line('{"ts_ms": 5, "type": "watch", "op_id": "a", "keys": [], '
                       '"deadline_ms": 10, "condition": "none"}')
    again = parse_line('{"ts_ms": 7, "type": "watch", "op_id": "a", "keys": [], '
                       '"deadline_ms": 90, "condition": "none"}')
    assert isinstance(first, Event) and isinstance(again, Event)
    resolver = Resolver()
    resolver.track_seen_changes()
    resolver.apply([first])
    resolver = Saved().through(resolver)
    resolver.apply([again])
    resolver.advance_to(100)
    outcomes, quarantine = resolver.drain()
    assert [(o.op_id, o.resolved_ms) for o in outcomes] == [("a", 10)]
    assert [(q.reason.value, q.ts_ms) for q in quarantine] == [("duplicate_op_id", 7)]


def test_an_op_id_past_its_retention_is_forgotten_even_across_a_save() -> None:
    def at(ts: int, deadline: int) -> Event:
        ev = parse_line(f'{{"ts_ms": {ts}, "type": "watch", "op_id": "a", "keys": [], '
                        f'"deadline_ms": {deadline}, "condition": "none"}}')
        assert isinstance(ev, Event)
        return ev

    resolver = Resolver(dedupe_retention_ms=10)
    resolver.track_seen_changes()
    resolver.apply([at(5, 100)])
    resolver.apply([at(50, 100)])  # past the retention, but still pending: a duplicate
    _, quarantine = resolver.drain()
    assert [q.ts_ms for q in quarantine] == [50]
    resolver = Saved().through(resolver)
    assert resolver.dedupe_retention_ms == 10
    resolver.advance_to(100)  # expires, and is forgotten
    resolver.apply([at(101, 200)])
    outcomes, quarantine = resolver.drain()
    assert [(o.op_id, o.resolved_ms) for o in outcomes] == [("a", 100)]
    assert quarantine == []
    assert list(resolver.pending) == ["a"]


@pytest.mark.parametrize(("seed", "retention_ms"), [(1, 40), (2, 300), (3, 1_000)])
def test_a_retention_forgets_the_same_ids_through_saves_as_in_one_go(
        seed: int, retention_ms: int) -> None:
    """Op ids reused after their retention, some while their first operation is still
    pending: applied in pieces, through saves that keep the seen ids as a log of
    changes, the resolver quarantines and resolves as in one go."""
    # An op stage's rows: the key stage applies the updates.
    events = sorted((e for e in well_formed(random_log(seed, rows=3_000))
                     if e.type.value in ("watch", "cancel")), key=order_key)
    whole = Resolver(dedupe_retention_ms=retention_ms)
    whole.apply(events)
    expected = whole.drain()
    assert expected[1], "the log has no duplicate to check"

    rng = random.Random(seed)
    resolver = Resolver(dedupe_retention_ms=retention_ms)
    resolver.track_seen_changes()
    saved = Saved()
    outcomes: list[OutcomeRow] = []
    quarantine = []
    lingered = 0
    for i, j in micro_batches(events, rng, 120):
        resolver.apply(events[i:j])
        done, dupes = resolver.drain()
        outcomes.extend(done)
        quarantine.extend(dupes)
        resolver = saved.through(resolver)
        assert set(saved.seen) == resolver.seen_op_ids
        assert resolver.now is not None
        lingered += sum(1 for op_id in resolver.pending
                        if saved.seen[op_id] < resolver.now - retention_ms)
    assert as_set(outcomes) == as_set(expected[0])
    assert quarantine == expected[1]
    assert lingered > 0, "no id outlived its retention while pending"


def test_time_never_goes_back() -> None:
    resolver = Resolver()
    resolver.advance_to(10)
    with pytest.raises(ValueError, match="t must not go back"):
        resolver.advance_to(9)


def test_resolved_operations_leave_the_state() -> None:
    lines = [
        '{"ts_ms": 1, "type": "watch", "op_id": "p", "keys": ["k"], "deadline_ms": 50,'
        ' "condition": "all_at_least", "targets": {"k": 3}}',
        '{"ts_ms": 2, "type": "update", "key": "k", "value": 3}',
    ]
    events = [e for e in map(parse_line, lines) if isinstance(e, Event)]
    resolver = Resolver()
    resolver.apply(events[:1])
    assert resolver.entry_ids() == ["p"]
    # A pending operation costs no lock of its own: the resolver's is shared.
    assert [op.lock for op in resolver.pending.values()] == [resolver.op_lock]
    resolver.apply(events[1:])
    assert resolver.pending == {}
    assert resolver.entry_ids() == []
    assert resolver.next_deadline() is None


def well_formed(lines: list[str]) -> list[Event]:
    return [e for e in map(parse_line, lines) if isinstance(e, Event)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rows_in_wire_form_sort_as_their_events_do(seed: int) -> None:
    events = well_formed(random_log(seed))
    by_wire = sorted(events, key=lambda e: wire_order(to_wire(e)))
    assert by_wire == sorted(events, key=order_key)
    assert [event_from_wire(to_wire(e)) for e in by_wire] == by_wire


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_rows_applied_in_wire_form_resolve_as_their_events_do(seed: int) -> None:
    """Ties, errors, cancels, duplicate ids and every condition (random_log), applied
    in pieces: ``apply_wire`` must leave the same outcomes, quarantine and counters."""
    events = sorted(well_formed(random_log(seed)), key=order_key)
    assert any(e.error is not None for e in events), "the log has no error to check"
    as_events, as_wire = Resolver(), Resolver()
    rng = random.Random(seed)
    i = 0
    while i < len(events):
        j = min(len(events), i + rng.randrange(1, 60))
        as_events.apply(events[i:j])
        as_wire.apply_wire([to_wire(e) for e in events[i:j]])
        i = j
    assert as_wire.drain() == as_events.drain()
    assert (as_wire.values, as_wire.update_counts, as_wire.seen_op_ids) == (
        as_events.values, as_events.update_counts, as_events.seen_op_ids)
    assert [as_wire.op_entry(op_id) for op_id in as_wire.entry_ids()] == [
        as_events.op_entry(op_id) for op_id in as_events.entry_ids()]
    assert (as_wire.applied, as_wire.ignored_cancels) == (as_events.applied,
                                                           as_events.ignored_cancels)
