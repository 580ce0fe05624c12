"""An op partition's seen op ids as a log of chunks: read back as written, and a
worker's older copy caught up with the chunks after it only while the log still begins
with the chunks it was made from."""

from __future__ import annotations

import marshal

from tickwheel.pipeline.seen_ids import SeenIds
from tickwheel.pipeline.spark._seen_log import SeenLog

BATCHES: list[list[tuple[str, int | None]]] = [
    [("a", 1), ("b", 2)], [("c", 3), ("a", None)], [("d", 4)], [("b", None), ("e", 5)]]


def _write(writer: SeenLog, batches: list[list[tuple[str, int | None]]],
           log: list[bytes]) -> None:
    """What the op processor does with each batch's changes."""
    for changes in batches:
        chunk, rewrite = writer.record(changes)
        if rewrite:
            log[:] = [chunk]
        else:
            log.append(chunk)


def _replayed(batches: list[list[tuple[str, int | None]]]) -> dict[str, int]:
    seen = SeenIds()
    for changes in batches:
        seen.apply(changes)
    return seen.ids


def test_a_log_reads_back_the_ids_and_the_digest_it_was_written_with() -> None:
    writer, log = SeenLog(), []
    _write(writer, BATCHES, log)
    read = SeenLog.read(log)
    assert read.seen.ids == writer.seen.ids == _replayed(BATCHES)
    assert (read.chunks, read.digest) == (writer.chunks, writer.digest)
    assert read.chunks == len(log) == 4


def test_an_older_copy_is_caught_up_with_only_the_chunks_after_it(
        applied_seen_chunks: list[bytes]) -> None:
    here, log = SeenLog(), []
    _write(here, BATCHES[:2], log)
    there = SeenLog.read(log)  # another worker runs the next batches
    _write(there, BATCHES[2:], log)
    applied_seen_chunks.clear()
    caught_up = SeenLog.read(log, here)
    assert caught_up is here
    assert applied_seen_chunks == log[2:]
    assert here.seen.ids == _replayed(BATCHES)
    assert (here.chunks, here.digest) == (there.chunks, there.digest)


def test_a_copy_whose_last_batch_never_committed_is_not_used(
        applied_seen_chunks: list[bytes]) -> None:
    here, log = SeenLog(), []
    _write(here, BATCHES[:1], log)
    committed = list(log)
    _write(here, [[("x", 9)]], log)  # the batch fails after writing: the state rolls back
    log[:] = committed
    _write(SeenLog.read(log), BATCHES[1:], log)  # it runs again elsewhere, differently
    applied_seen_chunks.clear()
    read = SeenLog.read(log, here)
    assert read is not here and applied_seen_chunks == log  # replayed from the start
    assert read.seen.ids == _replayed(BATCHES)
    assert "x" in here.seen.ids  # the copy is left as it was


def test_a_copy_longer_than_the_log_is_not_used() -> None:
    here, log = SeenLog(), []
    _write(here, BATCHES, log)
    read = SeenLog.read(log[:2], here)
    assert read is not here
    assert read.seen.ids == _replayed(BATCHES[:2])


def test_a_copy_from_before_a_rewrite_is_replayed_from_the_start() -> None:
    here, log = SeenLog(), []
    _write(here, [[(f"id-{i}", i) for i in range(70_000)]], log)
    there = SeenLog.read(log)
    forget: list[tuple[str, int | None]] = [(f"id-{i}", None) for i in range(70_000)]
    _write(there, [forget, [("new", 1)]], log)
    assert [marshal.loads(chunk) for chunk in log] == [[], [("new", 1)]]  # rewritten
    read = SeenLog.read(log, here)
    assert read is not here
    assert read.seen.ids == {"new": 1} == there.seen.ids
    assert (read.chunks, read.digest) == (there.chunks, there.digest)
