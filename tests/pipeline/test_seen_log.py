"""An op partition's seen op ids as segments: read back as written, segments past the
dedupe retention removed whole, and a worker's older copy caught up with the segments
after it only while the segment it last read is stored as it read it."""

from __future__ import annotations

import marshal

from tickwheel.pipeline.state.seen_log import SeenLog, SeenSegment

Batch = tuple[list[tuple[str, int | None]], int]  # a batch's changes, and its time

BATCHES: list[Batch] = [([("a", 1), ("b", 2)], 2), ([("c", 3), ("a", None)], 3),
                        ([("d", 4)], 4), ([("b", None), ("e", 5)], 5)]


class SegmentStore:
    """The segments as the op processor stores them."""

    def __init__(self) -> None:
        self.segments: dict[int, SeenSegment] = {}
        self.next = 0

    def write(self, log: SeenLog, batches: list[Batch], retention: int | None = None) -> None:
        for changes, now in batches:
            write = log.record(changes, now, retention)
            if write.merged:
                self.segments.clear()
            else:
                for number in write.removed:
                    del self.segments[number]
            if write.segment is not None:
                self.segments[write.number] = write.segment
            self.next = log.next

    def read(self) -> SeenLog:
        return SeenLog.read(reversed(list(self.segments.items())), self.next)  # any order

    def catch_up(self, log: SeenLog) -> bool:
        return log.catch_up(self.next, self.segments.get)


def test_segments_read_back_the_ids_and_the_digest_they_were_written_with() -> None:
    writer, store = SeenLog(), SegmentStore()
    store.write(writer, BATCHES)
    read = store.read()
    # A forgotten id is not written: without a retention the ids are what was seen.
    assert read.ids == {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}
    assert writer.ids == {"c": 3, "d": 4, "e": 5}  # the writer applied the forgets too
    assert (read.next, read.digest, read.bytes) == (writer.next, writer.digest, writer.bytes)
    assert read.next == len(store.segments) == 4


def test_a_segment_goes_whole_once_every_id_in_it_is_past_the_retention() -> None:
    log, store = SeenLog(), SegmentStore()
    store.write(log, [([("a", 100), ("b", 150)], 150), ([("c", 200)], 200),
                      ([("d", 300)], 300)], retention=100)
    # At 300 with a retention of 100, ids before 200 are past it: the first segment
    # (latest 150) goes, the second (latest 200) stays.
    assert sorted(store.segments) == [1, 2]
    assert log.ids == {"c": 200, "d": 300}
    assert store.read().ids == log.ids
    store.write(log, [([], 1_000)], retention=100)  # no new id: segments still go
    assert store.segments == {} and log.ids == {} and log.bytes == 0


def test_an_id_seen_again_keeps_its_latest_time() -> None:
    log, store = SeenLog(), SegmentStore()
    store.write(log, [([("a", 100)], 100), ([("a", None)], 250), ([("a", 260)], 260)],
                retention=100)
    assert log.ids == {"a": 260} == store.read().ids
    assert sorted(store.segments) == [1]  # the first went at 250


def test_the_ids_kept_stay_flat_while_ids_pass_at_a_steady_rate() -> None:
    log, store = SeenLog(), SegmentStore()
    sizes = []
    for t in range(1, 601):  # 10 ids a "second" for 600 s, a retention of 60 s
        store.write(log, [([(f"id-{t}-{i}", t) for i in range(10)], t)], retention=60)
        if t > 120:
            sizes.append(sum(len(segment[0]) for segment in store.segments.values()))
    assert len(store.segments) == 61 and len(log.ids) == 610
    assert max(sizes) <= 1.05 * min(sizes)  # no saw: each segment written once, removed once


def test_too_many_segments_are_merged_into_one() -> None:
    log, store = SeenLog(merge_at=3), SegmentStore()
    store.write(log, [([(f"id-{t}", t)], t) for t in range(5)])
    assert sorted(store.segments) == [3, 4]  # 0 to 2 merged into 3 with id-3
    assert marshal.loads(store.segments[3][0]) == [("id-0", 0), ("id-1", 1), ("id-2", 2),
                                                   ("id-3", 3)]
    assert store.read().ids == log.ids == {f"id-{t}": t for t in range(5)}


def test_an_older_copy_is_caught_up_with_only_the_segments_after_it(
        applied_seen_chunks: list[bytes]) -> None:
    here, store = SeenLog(), SegmentStore()
    store.write(here, BATCHES[:2])
    there = store.read()  # another worker runs the next batches
    store.write(there, BATCHES[2:])
    applied_seen_chunks.clear()
    assert store.catch_up(here)
    assert applied_seen_chunks == [store.segments[2][0], store.segments[3][0]]
    assert here.ids == {"b": 2, "c": 3, "d": 4, "e": 5}  # its own forget of a, and the rest
    assert (here.next, here.digest) == (there.next, there.digest)


def test_a_copy_whose_last_batch_never_committed_is_not_used() -> None:
    here, store = SeenLog(), SegmentStore()
    store.write(here, BATCHES[:1])
    committed = dict(store.segments), store.next
    store.write(here, [([("x", 9)], 9)])  # the batch fails after writing: rolled back
    store.segments, store.next = committed
    store.write(store.read(), BATCHES[1:])  # it runs again elsewhere, differently
    assert not store.catch_up(here)
    assert "x" in here.ids  # the copy is left as it was


def test_a_copy_longer_than_the_log_or_whose_last_segment_went_is_not_used() -> None:
    here, store = SeenLog(), SegmentStore()
    store.write(here, BATCHES)
    shorter = SegmentStore()
    shorter.segments = {n: store.segments[n] for n in (0, 1)}
    shorter.next = 2
    assert not shorter.catch_up(here)
    old, store = SeenLog(), SegmentStore()
    store.write(old, [([("a", 100)], 100)], retention=10)
    store.write(store.read(), [([("b", 200)], 200)], retention=10)  # removes segment 0
    assert not store.catch_up(old)
