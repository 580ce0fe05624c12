"""Watchers: which pending operations each key wakes, sharded so keys rarely contend.

Kafka keeps 512 shards, each a map of key to watcher list behind one lock. tickwheel
does the same, but a watcher list is an insertion-ordered dict used as a set, so an
operation that completes or expires leaves the lists of all its keys at once, in O(1)
per key. Kafka leaves completed operations in the lists until a purge that runs after
``purgeInterval`` completions; under load those lists grew without bound (out of
memory incidents). A key whose list becomes empty is removed at once.

Most keys are watched by one operation at a time (a partition by its one produce, a
member by its heartbeat), so a key with a single watcher maps straight to the operation
and gets a dict only when a second one comes. That saves a dict per watched key
(allocated, tracked by the garbage collector, freed) and half the lookups of a watch and
an unwatch.

Each shard also counts the key events it has served (``epoch``): the purgatory reads
the counts before an operation's first try and again as it watches each key, and tries
a second time only if an event came through one of its shards in between (Kafka always
tries twice).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Final, cast

from tickwheel._mutex import new_lock

if TYPE_CHECKING:
    from tickwheel.purgatory._operation import DelayedOperation

__all__ = ["SHARDS", "Watchers"]

SHARDS: Final = 512


class _Shard:
    __slots__ = ("count", "epoch", "lists", "lock")

    def __init__(self) -> None:
        self.lock = new_lock()
        # key -> its one watcher, or a dict (used as an ordered set) of two or more.
        self.lists: dict[Hashable, object] = {}
        self.count = 0
        # Snapshots taken (key events served); only ever grows, under the lock.
        self.epoch = 0

    def drop_key(self, key: Hashable) -> None:
        del self.lists[key]
        if not self.lists:
            # A dict never shrinks its table; an empty shard starts afresh so memory
            # returns to where it was once the operations are gone.
            self.lists = {}


class Watchers:
    """Key -> the operations watching it, in ``SHARDS`` independently locked shards."""

    __slots__ = ("_shards",)

    def __init__(self) -> None:
        self._shards = [_Shard() for _ in range(SHARDS)]

    def _shard(self, key: Hashable) -> _Shard:
        return self._shards[hash(key) % SHARDS]

    def epochs(self, keys: tuple[Hashable, ...]) -> int:
        """The sum of the epochs of the shards of ``keys`` (a shard counted once per
        key). Read without the locks: it is compared with what ``watch`` returns, and
        epochs only grow, so equal sums mean no key event passed in between."""
        shards = self._shards
        total = 0
        for key in keys:
            total += shards[hash(key) % SHARDS].epoch
        return total

    def watch(self, key: Hashable, op: DelayedOperation) -> int:
        """Watch ``key`` for ``op``; return the shard's epoch as of the watch."""
        shard = self._shards[hash(key) % SHARDS]
        with shard.lock:
            lists = shard.lists
            entry = lists.get(key)
            if entry is None:
                lists[key] = op
                shard.count += 1
            elif isinstance(entry, dict):
                if op not in entry:
                    entry[op] = None
                    shard.count += 1
            elif entry is not op:
                lists[key] = {entry: None, op: None}
                shard.count += 1
            return shard.epoch

    def unwatch(self, key: Hashable, op: DelayedOperation) -> bool:
        shard = self._shards[hash(key) % SHARDS]
        with shard.lock:
            entry = shard.lists.get(key)
            if entry is op:
                shard.count -= 1
                shard.drop_key(key)
                return True
            if not isinstance(entry, dict) or op not in entry:
                return False
            del entry[op]
            shard.count -= 1
            if len(entry) == 1:
                # Back to a single watcher: drop the dict, as a new key would have none.
                for last in entry:
                    shard.lists[key] = last
            return True

    def snapshot(self, key: Hashable) -> list[DelayedOperation]:
        """The operations watching ``key`` now; the caller tries them without holding
        the shard's lock (completing one unwatches it from other shards)."""
        shard = self._shards[hash(key) % SHARDS]
        with shard.lock:
            shard.epoch += 1
            return _listed(shard.lists.get(key))

    def remove_key(self, key: Hashable) -> list[DelayedOperation]:
        shard = self._shard(key)
        with shard.lock:
            ops = _listed(shard.lists.pop(key, None))
            shard.count -= len(ops)
            return ops

    def purge_completed(self, first: int, count: int) -> int:
        """Drop resolved operations from shards ``first .. first+count-1`` (a safety
        net: resolution unwatches at once, so this normally finds nothing)."""
        purged = 0
        for i in range(first, first + count):
            shard = self._shards[i % SHARDS]
            with shard.lock:
                for key in list(shard.lists):
                    ops = _listed(shard.lists[key])
                    live = [op for op in ops if not op.is_completed]
                    if len(live) == len(ops):
                        continue
                    purged += len(ops) - len(live)
                    shard.count -= len(ops) - len(live)
                    if not live:
                        shard.drop_key(key)
                    elif len(live) == 1:
                        shard.lists[key] = live[0]
                    else:
                        shard.lists[key] = dict.fromkeys(live)
        return purged

    def operations(self) -> list[DelayedOperation]:
        """Every operation watching any key, each once."""
        seen: dict[DelayedOperation, None] = {}
        for shard in self._shards:
            with shard.lock:
                for entry in shard.lists.values():
                    for op in _listed(entry):
                        seen[op] = None
        return list(seen)

    @property
    def watched(self) -> int:
        """Watcher entries across all keys (an operation counts once per key)."""
        return sum(s.count for s in self._shards)

    @property
    def num_keys(self) -> int:
        return sum(len(s.lists) for s in self._shards)


def _listed(entry: object) -> list[DelayedOperation]:
    """A key's watchers as a new list (an entry is one operation or a dict of them)."""
    if entry is None:
        return []
    if isinstance(entry, dict):
        return list(entry)
    return [cast("DelayedOperation", entry)]
