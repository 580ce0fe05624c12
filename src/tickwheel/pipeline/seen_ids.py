"""SeenIds: the op ids a partition has seen, kept beside its state as a log of changes.

A partition must remember every op id it has seen (with ``--dedupe-retention-ms``, for
as long as the retention says) to quarantine duplicates. Rewritten whole with the
partition's state after every batch, those ids would be most of what a running service
writes. Kept instead as an append-only log of the resolver's changes
(:meth:`~tickwheel.pipeline.resolver.Resolver.take_seen_changes`), a batch writes only
what it changed, and the log is rewritten whole once it holds more than twice the
entries it must keep.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["SeenIds"]

#: Entries a log may hold beyond twice the live ones before it is rewritten, so that a
#: small log is not rewritten on every batch.
_SLACK = 65_536


class SeenIds:
    """The ids seen, each with the ``ts_ms`` of its first watch, in the order first
    seen (the order the resolver's retention forgets them in), and the length of the
    log they were read from or written to."""

    __slots__ = ("entries", "ids")

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.entries = 0

    def apply(self, changes: Iterable[tuple[str, int | None]]) -> None:
        """Apply changes in log order: ``(id, ts_ms)`` seen, ``(id, None)`` forgotten.
        An id seen again after it was forgotten moves to the end."""
        ids = self.ids
        n = 0
        for op_id, ts in changes:
            n += 1
            ids.pop(op_id, None)
            if ts is not None:
                ids[op_id] = ts
        self.entries += n

    def needs_rewrite(self) -> bool:
        """True once the log holds more than twice the entries it must keep."""
        return self.entries > 2 * len(self.ids) + _SLACK

    def rewrite(self) -> list[tuple[str, int | None]]:
        """The entries of a rewritten log: one per id kept."""
        self.entries = len(self.ids)
        return list(self.ids.items())
