"""A partition's entries as a log of numbered chunks: read back as the latest entry of
each id, written a batch's changes at a time, rewritten with what is held once the
log holds twice that, and cut into chunks of bounded size."""

from __future__ import annotations

import marshal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tickwheel.pipeline.state import entry_log as _entry_log
from tickwheel.pipeline.state.entry_log import EntryLog


class _Store:
    """What a partition holds, and its log as the state store keeps it."""

    def __init__(self) -> None:
        self.held: dict[str, Any] = {}
        self.chunks: dict[int, bytes] = {}
        self.digests: dict[int, bytes] = {}
        self.log = EntryLog()
        self.rewrites = 0

    def batch(self, changes: dict[str, Any]) -> None:
        for ident, entry in changes.items():
            if entry is None:
                self.held.pop(ident, None)
            else:
                self.held[ident] = entry
        written, first, rewrite = self.log.record(
            list(changes.items()), len(self.held), lambda: list(self.held.items()),
            lambda item: 10)
        if rewrite:
            self.chunks.clear()
            self.digests.clear()
            self.rewrites += 1
        for number, (blob, digest, _) in enumerate(written, first):
            self.chunks[number] = blob
            self.digests[number] = digest

    def catch_up(self, log: EntryLog) -> dict[str, Any] | None:
        return log.catch_up(len(self.chunks), self.digests.get, self.chunks.__getitem__)


def test_the_log_reads_back_each_ids_latest_entry_in_the_order_first_written() -> None:
    store = _Store()
    store.batch({"a": 1, "b": 2})
    store.batch({"c": 3, "a": 10})
    store.batch({"b": None, "d": 4})
    log, held = EntryLog.read(reversed(list(store.chunks.items())))
    assert list(held.items()) == [("a", 10), ("c", 3), ("d", 4)]
    assert (log.chunks, log.entries, log.bytes, log.digest) == (
        store.log.chunks, store.log.entries, store.log.bytes, store.log.digest)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from("abcdefghij"),
                                st.none() | st.integers(0, 9), max_size=6), max_size=40))
def test_whatever_the_batches_the_log_holds_what_is_held(
        batches: list[dict[str, Any]]) -> None:
    store = _Store()
    for changes in batches:
        store.batch(changes)
        _, held = EntryLog.read(store.chunks.items())
        assert held == store.held


def test_the_log_is_rewritten_once_it_holds_twice_what_is_held(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_entry_log, "REWRITE_SLACK", 4)
    store = _Store()
    store.batch({"a": 0, "b": 0})
    for n in range(1, 7):  # 2 held; the log grows to 8 entries: 2 * 2 + 4
        store.batch({"a": n})
    assert store.rewrites == 0 and len(store.chunks) == 7
    store.batch({"a": 7})  # a ninth: the log is rewritten with the two held
    assert store.rewrites == 1
    assert store.log.entries == 2
    assert marshal.loads(store.chunks[0]) == [("a", 7), ("b", 0)]
    assert len(store.chunks) == 1


def test_a_chunk_holds_a_bounded_number_of_bytes_and_entries(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_entry_log, "CHUNK_BYTES", 100)
    monkeypatch.setattr(_entry_log, "CHUNK_ENTRIES", 3)
    log = EntryLog()
    items = [("big", "x" * 250), ("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", "y" * 60),
             ("f", "z" * 60)]
    written, first, rewrite = log.record(items, 100, list,
                                         lambda item: len(str(item[1])) + 8)
    assert (first, rewrite) == (0, False)
    assert [[ident for ident, _ in marshal.loads(blob)] for blob, _, _ in written] == [
        ["big"], ["a", "b", "c"], ["d", "e", "f"]]
    # A chunk closes once it reaches the bound: an entry bigger than it goes alone.


def test_changes_that_fit_one_chunk_are_encoded_whole_without_sizing_each(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_entry_log, "CHUNK_BYTES", 1_000)
    sized: list[Any] = []

    def size(item: Any) -> int:
        sized.append(item)
        return 10_000  # an estimate far above the bound: never asked for
    log = EntryLog()
    items = [(f"k{n}", n) for n in range(20)]
    written, _, _ = log.append(items, size)
    assert [marshal.loads(chunk.blob) for chunk in written] == [items]
    assert [chunk.entries for chunk in written] == [20] and sized == []
    # Past the bound in bytes, the pieces are cut by the sizes given.
    written, _, _ = log.append([(f"k{n}", f"{n:03d}" + "x" * 100) for n in range(20)],
                               lambda item: 400)
    assert [chunk.entries for chunk in written] == [3] * 6 + [2]
    assert log.chunks == 8 and log.entries == 40
    assert log.append([], size).chunks == [] and log.chunks == 8


def test_a_log_missing_a_chunk_is_refused_by_name() -> None:
    store = _Store()
    for n in range(3):
        store.batch({f"k{n}": n})
    del store.chunks[1]
    with pytest.raises(ValueError, match="lacks chunk 1"):
        EntryLog.read(store.chunks.items())


def test_an_older_copy_is_caught_up_with_the_entries_after_it_nones_included() -> None:
    store = _Store()
    store.batch({"a": 1, "b": 2})
    older = EntryLog.read(store.chunks.items())[0]
    store.batch({"a": 3, "b": None})
    store.batch({"c": 4})
    read: list[int] = []
    later = older.catch_up(len(store.chunks), store.digests.get,
                           lambda n: read.append(n) or store.chunks[n])
    assert later == {"a": 3, "b": None, "c": 4}
    assert read == [1, 2]  # nothing before the copy's own chunks
    assert (older.chunks, older.digest) == (store.log.chunks, store.log.digest)


def test_a_copy_whose_chunks_differ_from_the_log_is_not_used() -> None:
    store = _Store()
    store.batch({"a": 1})
    older = EntryLog.read(store.chunks.items())[0]
    older.record([("x", 9)], 2, list, lambda item: 10)  # a batch that never committed
    store.batch({"a": 2})  # run again elsewhere, differently
    chunks = older.chunks
    assert store.catch_up(older) is None
    assert older.chunks == chunks  # left as it was


def test_a_copy_longer_than_the_log_is_not_used() -> None:
    store = _Store()
    store.batch({"a": 1})
    store.batch({"a": 2})
    older = EntryLog.read(store.chunks.items())[0]
    del store.chunks[1], store.digests[1]
    assert store.catch_up(older) is None


def test_a_copy_from_before_a_rewrite_is_not_caught_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_entry_log, "REWRITE_SLACK", 0)
    store = _Store()
    store.batch({"a": 1, "b": 1})
    older = EntryLog.read(store.chunks.items())[0]
    for n in range(3):
        store.batch({"a": n + 2})
    assert store.rewrites
    assert store.catch_up(older) is None
