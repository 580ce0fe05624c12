"""A shard's seen op ids, saved as a log of changes between micro-batches."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

from tickwheel.pipeline import _seen_log
from tickwheel.pipeline._seen_log import LogHead, load_seen, save_seen
from tickwheel.pipeline.events import Event, parse_line
from tickwheel.pipeline.generator import GeneratorConfig, generate
from tickwheel.pipeline.resolver import Resolver, order_key


class DictStore:
    """Spark's MapState for one grouping key, with the entries read counted."""

    def __init__(self) -> None:
        self.entries: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.reads = 0

    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        self.reads += 1
        return self.entries.get(key)

    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        self.entries[key] = value

    def clear(self) -> None:
        self.entries.clear()


def batches(seed: int, size: int) -> list[list[Event]]:
    rows = [parse_line(json.dumps(r)) for r in generate(GeneratorConfig(events=6_000,
                                                                        seed=seed))]
    events = sorted((e for e in rows if isinstance(e, Event)), key=order_key)
    return [events[i:i + size] for i in range(0, len(events), size)]


@pytest.mark.parametrize("retention", [None, 200])
def test_the_log_holds_the_set_after_every_batch(retention: int | None,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_seen_log, "ENTRY_LIMIT", 8)  # compacts a few times
    resolver = Resolver(dedupe_retention_ms=retention)
    resolver.track_seen_changes()
    store, head = DictStore(), LogHead()
    heads = []
    forgotten_any = False
    for n, batch in enumerate(batches(seed=3, size=150)):
        resolver.apply(batch)
        added, forgotten = resolver.take_seen_changes()
        forgotten_any |= bool(forgotten)
        head = save_seen(store, head, f"t{n}", resolver.seen_op_ids, added, forgotten)
        assert len(head.tokens) <= 8
        assert load_seen(store, head) == resolver.seen_op_ids
        heads.append((set(resolver.seen_op_ids), head))
    assert forgotten_any == (retention is not None)
    assert len(store.entries) < len(heads)  # compacted
    # A set built from an earlier head catches up by reading only the later entries.
    earlier_set, earlier_head = heads[-2]
    store.reads = 0
    assert load_seen(store, head, (earlier_set, earlier_head)) == resolver.seen_op_ids
    assert store.reads == len(head.tokens) - len(earlier_head.tokens) == 1


def test_a_held_set_the_log_no_longer_starts_with_is_not_used() -> None:
    store = DictStore()
    head = save_seen(store, LogHead(), "t0", {"a"}, ["a"], [])
    head = save_seen(store, head, "t1", {"a", "b"}, ["b"], [])
    # Built by a batch whose commit failed: its entry was rolled back and rewritten.
    held = ({"a", "b", "zombie"}, LogHead(("t0", "t1", "failed"), 3))
    retried = save_seen(store, head, "t2", {"a", "b", "c"}, ["c"], [])
    assert load_seen(store, retried, held) == {"a", "b", "c"}


def test_a_set_saved_whole_before_is_logged_whole_at_the_next_save() -> None:
    store = DictStore()
    head = save_seen(store, LogHead(complete=False), "t0", {"a", "b"}, ["b"], [])
    assert head == LogHead(("t0",), 2)
    assert load_seen(store, head) == {"a", "b"}


def test_a_missing_entry_is_an_error_not_an_empty_set() -> None:
    with pytest.raises(RuntimeError, match="entry 0 of the seen-id log is missing"):
        load_seen(DictStore(), LogHead(("t0",), 1))


def test_a_snapshot_without_its_seen_ids_needs_them_back() -> None:
    ev = parse_line('{"ts_ms": 1, "type": "watch", "op_id": "a", "keys": [], '
                    '"deadline_ms": 100, "condition": "none"}')
    assert isinstance(ev, Event)
    resolver = Resolver()
    resolver.apply([ev])
    snapshot = pickle.loads(pickle.dumps(resolver.snapshot(with_seen=False)))
    with pytest.raises(ValueError, match="seen_op_ids"):
        Resolver.restore(snapshot)
    again = Resolver.restore(snapshot, {"a"})
    again.apply([ev])  # still a duplicate
    _, quarantine = again.drain()
    assert [q.reason.value for q in quarantine] == ["duplicate_op_id"]


def test_changes_are_only_kept_when_asked_for() -> None:
    with pytest.raises(RuntimeError, match="track_seen_changes"):
        Resolver().take_seen_changes()
