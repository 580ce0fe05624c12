"""Watchers: the key -> operations map behind the purgatory, and its safety-net purge."""

from __future__ import annotations

from tests.purgatory.conftest import MockOperation
from tickwheel.purgatory._watchers import SHARDS, Watchers


def test_a_key_goes_from_one_watcher_to_many_and_back_in_watch_order() -> None:
    w = Watchers()
    a, b, c = MockOperation(1_000), MockOperation(1_000), MockOperation(1_000)
    w.watch("k", a)
    assert w.snapshot("k") == [a]
    w.watch("k", b)
    w.watch("k", c)
    assert w.snapshot("k") == [a, b, c]
    assert (w.watched, w.num_keys) == (3, 1)
    assert w.unwatch("k", b)
    assert w.snapshot("k") == [a, c]
    assert w.unwatch("k", a)
    assert w.snapshot("k") == [c]
    w.watch("k", a)  # a second watcher again, after the key fell back to one
    assert w.snapshot("k") == [c, a]
    assert w.unwatch("k", c) and w.unwatch("k", a)
    assert (w.snapshot("k"), w.watched, w.num_keys) == ([], 0, 0)


def test_watching_twice_counts_once_and_unwatching_a_stranger_is_a_no_op() -> None:
    w = Watchers()
    a, b, stranger = MockOperation(1_000), MockOperation(1_000), MockOperation(1_000)
    w.watch("one", a)
    w.watch("one", a)
    w.watch("two", a)
    w.watch("two", b)
    w.watch("two", b)
    assert (w.watched, w.num_keys) == (3, 2)
    assert not w.unwatch("one", stranger)
    assert not w.unwatch("two", stranger)
    assert not w.unwatch("nobody", a)
    assert (w.snapshot("one"), w.snapshot("two"), w.watched) == ([a], [a, b], 3)


def test_remove_key_hands_back_every_watcher_of_the_key_only() -> None:
    w = Watchers()
    a, b = MockOperation(1_000), MockOperation(1_000)
    w.watch("single", a)
    w.watch("double", a)
    w.watch("double", b)
    assert w.remove_key("double") == [a, b]
    assert w.remove_key("single") == [a]
    assert w.remove_key("single") == []
    assert (w.watched, w.num_keys) == (0, 0)


def test_purge_drops_resolved_operations_left_in_the_lists() -> None:
    # Operations resolved outside a purgatory are not unwatched: only the purge finds them.
    w = Watchers()
    alone, gone1, gone2, stays = (MockOperation(1_000) for _ in range(4))
    w.watch("alone", alone)
    for op in (gone1, stays, gone2):
        w.watch("shared", op)
    w.watch("pair", gone1)
    w.watch("pair", gone2)
    for op in (alone, gone1, gone2):
        assert op.force_complete()
    assert w.watched == 6
    assert w.purge_completed(0, SHARDS) == 5
    assert (w.watched, w.num_keys) == (1, 1)
    assert w.snapshot("shared") == [stays]
    assert w.purge_completed(0, SHARDS) == 0
