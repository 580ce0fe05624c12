"""A shard's seen op ids, saved as a log of changes in a keyed state.

The seen ids are most of a shard's state (every op id ever watched, unless a dedupe
retention bounds them), and they only grow by what a micro-batch watched. Saved whole
with the rest of the shard, each batch moved the whole set through the state server
twice (written, and read back by the next batch's worker): measured at 73% of a
shard's 7.6 MB snapshot after 1M events, and growing with the stream. As a log, a
batch writes an entry with the ids it added and forgot; a worker that holds the set
as of an earlier entry reads only the entries after it; the log is compacted into
one entry when it gets long.

The log's head (:class:`LogHead`) is saved with the rest of the shard, in the same
state-store commit as the entries, so they agree after any failure: each entry is
named by the token of the save that wrote it, and a set held in memory is used only if
the head's tokens start with the ones it was built from.
"""

from __future__ import annotations

import marshal
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["ENTRY_LIMIT", "LogHead", "SeenStore", "load_seen", "save_seen"]

#: Entries before the log is compacted into one: a worker that must read the whole
#: log reads at most this many entries.
ENTRY_LIMIT = 64
# Compacted too when the entries name more ids than twice the set (ids forgotten
# through the dedupe retention), plus this much, so small sets are not rewritten
# over and over.
_SLACK = 10_000


class SeenStore(Protocol):
    """What the log needs of Spark's ``MapState``: entry number -> (added, forgotten)."""

    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None: ...  # noqa: N802

    def updateValue(self, key: tuple[Any, ...],  # noqa: N802
                    value: tuple[Any, ...]) -> None: ...

    def clear(self) -> None: ...


@dataclass(frozen=True, slots=True)
class LogHead:
    """The tokens of the log's entries, in order, and how many ids they name."""

    tokens: tuple[str, ...] = ()
    ids_logged: int = 0
    # False for a set the log does not hold yet (restored from a snapshot that saved
    # the ids whole): the next save compacts.
    complete: bool = field(default=True)


def save_seen(store: SeenStore, head: LogHead, token: str, seen: set[str],
              added: list[str], forgotten: list[str]) -> LogHead:
    """Log the changes that made ``seen``; the head to save with the shard."""
    logged = head.ids_logged + len(added) + len(forgotten)
    if (not head.complete or len(head.tokens) >= ENTRY_LIMIT
            or logged > 2 * len(seen) + _SLACK):
        store.clear()
        store.updateValue((0,), (marshal.dumps(list(seen)), marshal.dumps([])))
        return LogHead((token,), len(seen))
    if not added and not forgotten:
        return head
    store.updateValue((len(head.tokens),), (marshal.dumps(added), marshal.dumps(forgotten)))
    return LogHead((*head.tokens, token), logged)


def load_seen(store: SeenStore, head: LogHead,
              held: tuple[set[str], LogHead] | None = None) -> set[str]:
    """The set the log holds; ``held`` is a set built earlier from this log with the
    head it was built from: if the log still starts with that head's entries, only
    the later entries are read, into that set."""
    seen: set[str] = set()
    start = 0
    if held is not None:
        held_seen, held_head = held
        if held_head.complete and head.tokens[:len(held_head.tokens)] == held_head.tokens:
            seen, start = held_seen, len(held_head.tokens)
    for number in range(start, len(head.tokens)):
        entry = store.getValue((number,))
        if entry is None:
            raise RuntimeError(f"entry {number} of the seen-id log is missing")
        seen.update(marshal.loads(entry[0]))
        seen.difference_update(marshal.loads(entry[1]))
    return seen
