"""A partition's entries as the Spark engine keeps them: a log of chunks in a
``MapState`` keyed by their number, holding the entries each batch changed (an op
stage's operations, a key stage's values and registrations), or after a rewrite the
entries held.

A micro-batch so writes what it changed, not everything the partition holds, and a
scheduler with a million operations pending does not write them all on every trigger
(docs/spark-engine.md measures both). The log is rewritten once it holds more than
twice the entries held (plus :data:`REWRITE_SLACK`): it stays within a small multiple
of what is held, and the rewrites cost each change a bounded number of writes. Each
chunk is a value of its own of at most about :data:`CHUNK_BYTES`, so no one value in
the store grows with the partition.

Like the seen op ids' log (:mod:`~tickwheel.pipeline.spark._seen_log`), each chunk
extends a digest of the log so far, which is stored with it: a worker's older copy of
the partition whose digest is the one stored with its last chunk is caught up with the
chunks after it (:meth:`EntryLog.catch_up`), and reads nothing before them.
"""

from __future__ import annotations

import marshal
from collections.abc import Callable, Iterable
from typing import Any

from tickwheel.pipeline.spark._seen_log import chain_digest

__all__ = ["CHUNK_BYTES", "CHUNK_ENTRIES", "REWRITE_SLACK", "EntryLog"]

#: About the most bytes of entries in one chunk.
CHUNK_BYTES = 8 << 20
#: The most entries in one chunk.
CHUNK_ENTRIES = 65_536
#: Entries the log may hold beyond twice those held before it is rewritten: a few
#: batches' changes where few are held, so that a service's state stays near what it
#: holds (a rewrite then writes little); twice what is held dominates where many are.
REWRITE_SLACK = 4_096


class EntryLog:
    """How much the log holds (chunks, numbered from 0; entries; bytes) and the digest
    of its chunks in order."""

    __slots__ = ("bytes", "chunks", "digest", "entries")

    def __init__(self) -> None:
        self.chunks = 0
        self.entries = 0
        self.bytes = 0
        self.digest = b""

    @classmethod
    def read(cls, chunks: Iterable[tuple[int, bytes]]) -> tuple[EntryLog, dict[Any, Any]]:
        """The log of ``(number, chunk)`` (in any order) and the entries it holds: each
        id's latest, in the order ids were first written; ids whose latest entry is
        None are held no more."""
        blobs = sorted(chunks)
        for expected, (number, _) in enumerate(blobs):
            if number != expected:
                raise ValueError(f"the partition's state lacks chunk {expected} of its "
                                 f"entries (found {number})")
        log = cls()
        return log, log._fold(blobs, drop=True)

    def catch_up(self, chunks: int, digest_of: Callable[[int], bytes | None],
                 chunk_of: Callable[[int], bytes]) -> dict[Any, Any] | None:
        """The entries written since this log was (Nones included, for an older copy of
        the partition to take), if the log of ``chunks`` chunks still begins with the
        chunks this one was made from: ``digest_of(n)`` is the digest stored with
        chunk ``n``, ``chunk_of(n)`` the chunk. None, and this log left as it was, if
        it does not."""
        if self.chunks > chunks or (self.chunks and digest_of(self.chunks - 1) != self.digest):
            return None
        return self._fold([(n, chunk_of(n)) for n in range(self.chunks, chunks)], drop=False)

    def _fold(self, blobs: list[tuple[int, bytes]], drop: bool) -> dict[Any, Any]:
        held: dict[Any, Any] = {}
        for _, blob in blobs:
            items: list[tuple[Any, Any]] = marshal.loads(blob)
            for ident, entry in items:
                if entry is None and drop:
                    held.pop(ident, None)
                else:
                    held[ident] = entry
            self.chunks += 1
            self.entries += len(items)
            self.bytes += len(blob)
            self.digest = chain_digest(self.digest, blob)
        return held

    def record(self, changed: list[tuple[Any, Any]], held: int,
               everything: Callable[[], list[tuple[Any, Any]]],
               size: Callable[[tuple[Any, Any]], int],
               ) -> tuple[list[tuple[bytes, bytes]], int, bool]:
        """Take a batch's changed entries; ``held`` is how many the partition holds (or
        at most twice that), ``everything`` gives them all, ``size`` an entry's bytes.
        Returns the chunks to write, each with the log's digest up to it, the number
        of the first, and True if they replace the log (a rewrite) rather than extend
        it."""
        rewrite = self.entries + len(changed) > 2 * held + REWRITE_SLACK
        if rewrite:
            changed = everything()
            self.chunks = self.entries = self.bytes = 0
            self.digest = b""
        first = self.chunks
        written = []
        for piece in _pieces(changed, size):
            blob = marshal.dumps(piece)
            self.digest = chain_digest(self.digest, blob)
            written.append((blob, self.digest))
        self.chunks += len(written)
        self.entries += len(changed)
        self.bytes += sum(len(blob) for blob, _ in written)
        return written, first, rewrite


def _pieces(items: list[tuple[Any, Any]],
            size: Callable[[tuple[Any, Any]], int]) -> Iterable[list[tuple[Any, Any]]]:
    start = 0
    n = len(items)
    while start < n:
        end = start
        total = 0
        while end < n and end - start < CHUNK_ENTRIES and (total < CHUNK_BYTES or end == start):
            total += size(items[end])
            end += 1
        yield items[start:end]
        start = end
