"""EntryLog: a partition's entries as a log of numbered chunks, whichever store keeps it.

A batch writes the entries it changed (an op stage's operations, a key stage's values
and registrations), not everything the partition holds, so a scheduler with a million
operations pending does not write them all on every trigger. The log is rewritten as
the entries held once it holds more than twice that (plus :data:`REWRITE_SLACK`): it
stays within a small multiple of what is held, and the rewrites cost each change a
bounded number of writes. A chunk holds at most :data:`CHUNK_ENTRIES` entries and about
:data:`CHUNK_BYTES`, so that no one value grows with the partition.

Two stores keep the chunks: files for the local engine
(:class:`~tickwheel.pipeline.state.entry_files.EntryFiles`) and, in the Spark engine, a
``MapState`` keyed by chunk number (``spark/_tasks.py``). Each chunk extends a digest of
the log (:func:`~tickwheel.pipeline.state.encoding.chain_digest`): a worker's older copy
of a partition whose digest is the one stored with the log's last chunk it knows is
caught up with the chunks after it (:meth:`EntryLog.catch_up`), and reads nothing before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from tickwheel.pipeline.state.encoding import chain_digest, decode, encode

__all__ = ["CHUNK_BYTES", "CHUNK_ENTRIES", "REWRITE_SLACK", "Chunk", "EntryLog", "EntryWrite"]

#: About the most bytes of entries in one chunk.
CHUNK_BYTES = 8 << 20
#: The most entries in one chunk.
CHUNK_ENTRIES = 65_536
#: Entries the log may hold beyond twice those held before it is rewritten: a few
#: batches' changes where few are held, so that a service's state stays near what it
#: holds (a rewrite then writes little); twice what is held dominates where many are.
REWRITE_SLACK = 4_096

#: A ``(ident, entry)`` pair; an entry of None says the id is held no more.
Entry = tuple[Any, Any]


class Chunk(NamedTuple):
    """A chunk as stored: its encoded entries, the digest of the log up to it, and how
    many entries it holds."""

    blob: bytes
    digest: bytes
    entries: int


class EntryWrite(NamedTuple):
    """What a batch writes: ``chunks``, numbered from ``first``, which replace the whole
    log if ``rewrite``, else extend it."""

    chunks: list[Chunk]
    first: int
    rewrite: bool


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
        """The entries of the stored chunks beyond this copy's (Nones included, for an
        older copy of the partition to take), if the stored log of ``chunks`` chunks
        begins with the chunks this copy holds: ``digest_of(n)`` is the digest stored
        with chunk ``n``, ``chunk_of(n)`` the chunk. None, and this copy unchanged, if
        it does not."""
        if self.chunks > chunks or (self.chunks and digest_of(self.chunks - 1) != self.digest):
            return None
        return self._fold([(n, chunk_of(n)) for n in range(self.chunks, chunks)], drop=False)

    def _fold(self, blobs: list[tuple[int, bytes]], drop: bool) -> dict[Any, Any]:
        held: dict[Any, Any] = {}
        for _, blob in blobs:
            items: list[Entry] = decode(blob)
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

    def rewrite_due(self, held: int, changed: int = 0) -> bool:
        """Whether the log, with ``changed`` more entries, holds more than twice the
        ``held`` entries (plus :data:`REWRITE_SLACK`)."""
        return self.entries + changed > 2 * held + REWRITE_SLACK

    def append(self, changed: list[Entry], size: Callable[[Entry], int]) -> EntryWrite:
        """The chunks that extend the log with ``changed`` (``size``: an entry's bytes)."""
        first = self.chunks
        written = []
        for blob, entries in _chunks(changed, size):
            self.digest = chain_digest(self.digest, blob)
            written.append(Chunk(blob, self.digest, entries))
        self.chunks += len(written)
        self.entries += len(changed)
        self.bytes += sum(len(chunk.blob) for chunk in written)
        return EntryWrite(written, first, False)

    def rewrite(self, held: list[Entry], size: Callable[[Entry], int]) -> EntryWrite:
        """The chunks of a log that holds ``held`` alone, to replace this one."""
        self.chunks = self.entries = self.bytes = 0
        self.digest = b""
        return self.append(held, size)._replace(rewrite=True)

    def record(self, changed: list[Entry], held: int, everything: Callable[[], list[Entry]],
               size: Callable[[Entry], int]) -> EntryWrite:
        """What to write for a batch's ``changed`` entries in one step: them, or the log
        rewritten with ``everything()`` held if it would be due (``held``: how many the
        partition holds, or at most twice that)."""
        if self.rewrite_due(held, len(changed)):
            return self.rewrite(everything(), size)
        return self.append(changed, size)


def _chunks(items: list[Entry], size: Callable[[Entry], int],
            ) -> Iterable[tuple[bytes, int]]:
    """``items`` encoded in chunks, each with how many entries it holds: a batch's
    changes (a few thousand entries) in one encoder call, without the size of each
    entry, when they fit one chunk; in pieces cut by ``size`` when they do not."""
    if len(items) <= CHUNK_ENTRIES:
        blob = encode(items)
        if len(blob) <= CHUNK_BYTES:
            if items:
                yield blob, len(items)
            return
    for piece in _pieces(items, size):
        yield encode(piece), len(piece)


def _pieces(items: list[Entry], size: Callable[[Entry], int]) -> Iterable[list[Entry]]:
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
