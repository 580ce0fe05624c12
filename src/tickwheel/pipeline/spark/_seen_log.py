"""An op partition's seen op ids as the Spark engine keeps them: a log of chunks in a
``ListState``, one per batch that changed them (``marshal``-encoded
:meth:`~tickwheel.pipeline.resolver.Resolver.take_seen_changes`), or one chunk of all
of them after a rewrite.

Replaying the log costs what the retention keeps (at 5,000 events a second and a
minute's retention, some 85k ids and a 5 MB log per partition), and a worker replays it
whenever it runs a partition that another worker ran last. So each chunk read or
written extends a digest of the log so far (BLAKE2b, keyed with the previous digest):
a worker's older copy whose digest matches the same prefix of the log today is caught
up with the chunks after it, instead of replayed from the start.
"""

from __future__ import annotations

import hashlib
import marshal
from collections.abc import Iterable

from tickwheel.pipeline.seen_ids import SeenIds

__all__ = ["SeenLog", "chain_digest"]


def chain_digest(digest: bytes, chunk: bytes) -> bytes:
    """The digest of a log of chunks that ``digest`` was, with ``chunk`` after them."""
    return hashlib.blake2b(chunk, digest_size=16, key=digest).digest()


class SeenLog:
    """The ids a log of chunks gives (:attr:`seen`), with how many chunks that took and
    the digest of those chunks in order."""

    __slots__ = ("bytes", "chunks", "digest", "seen")

    def __init__(self) -> None:
        self.seen = SeenIds()
        self.chunks = 0
        self.bytes = 0  # of the chunks
        self.digest = b""

    @classmethod
    def read(cls, chunks: Iterable[bytes], kept: SeenLog | None = None) -> SeenLog:
        """The ids of a log of ``chunks``. ``kept``, an earlier copy of the same
        partition's, is caught up with the chunks after its own and returned if the
        log still begins with the chunks it was made from; otherwise the log is
        replayed from the start and ``kept`` is left as it was."""
        blobs = list(chunks)
        if kept is not None and kept.chunks <= len(blobs):
            digest = b""
            for blob in blobs[:kept.chunks]:
                digest = chain_digest(digest, blob)
            if digest == kept.digest:
                for blob in blobs[kept.chunks:]:
                    kept._apply(blob)
                return kept
        log = cls()
        for blob in blobs:
            log._apply(blob)
        return log

    def record(self, changes: list[tuple[str, int | None]]) -> tuple[bytes, bool]:
        """Apply a batch's changes; returns the chunk to write, and True if it replaces
        the log (a rewrite, once the log holds twice what it must keep) rather than
        being appended to it."""
        seen = self.seen
        seen.apply(changes)
        if seen.needs_rewrite():
            blob = marshal.dumps(seen.rewrite())
            self.chunks, self.bytes, self.digest = 1, len(blob), chain_digest(b"", blob)
            return blob, True
        blob = marshal.dumps(changes)
        self.chunks, self.digest = self.chunks + 1, chain_digest(self.digest, blob)
        self.bytes += len(blob)
        return blob, False

    def _apply(self, blob: bytes) -> None:
        self.seen.apply(marshal.loads(blob))
        self.chunks, self.digest = self.chunks + 1, chain_digest(self.digest, blob)
        self.bytes += len(blob)
