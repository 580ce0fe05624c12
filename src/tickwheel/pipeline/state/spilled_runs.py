"""SpilledRuns: an external merge sort's runs, kept in unnamed temporary files.

A log too large to sort in memory is sorted a run at a time: the caller sorts each
run, :meth:`SpilledRuns.spill` writes it out, and :meth:`SpilledRuns.merge` reads all
of them back at once, a block of rows from each, and yields every row in one sorted
order. The merge is stable: rows with equal keys come in the order they were spilled,
so the result is exactly what one stable sort of everything would give.

The merge works a block at a time rather than a row at a time. The largest key read
so far from each run bounds what that run can still hold, so every row below the
smallest of those bounds can go out now: it is taken from each run in run order, and
one stable sort of them (Timsort, over runs already sorted) puts them in order. Rows
leave in lists that never split a group (``group_start`` gives the first key of a
key's group), so that a caller can apply a group at once.

Runs are merged in tiers, like the levels of a log-structured merge tree. When
``fan_in`` runs of one tier are on disk, they are merged into one run of the tier
above. The runs on disk are then in tiers that never rise from the newest back to the
oldest, so the runs merged are always the newest ones, in order, which keeps the sort
stable. Open files and the merge's memory stay at ``fan_in`` runs per tier, and every
row is rewritten once per tier: for ``n`` rows in runs of ``r``, that is
``log(n / r)`` to the base ``fan_in`` times.

For example, with ``fan_in`` 3: runs a, b and c are spilled at tier 0 and merged into
one run abc at tier 1. Then d, e and f make def, g, h and i make ghi, and abc, def and
ghi are merged into one run at tier 2.

Files come from :func:`tempfile.TemporaryFile`, which on Linux has no name at all, so
nothing is left behind by a crash, even kill -9.
"""

from __future__ import annotations

import bisect
import pickle
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Generic, TypeVar

from tickwheel._validate import check_positive_int

__all__ = ["SpilledRuns"]

T = TypeVar("T")

_BLOCK_ROWS = 2048
#: A block's pickled bytes at most (a lone row may take more): rows of any size keep a
#: merge's memory to about ``fan_in`` blocks.
_BLOCK_BYTES = 1 << 20


class _Run:
    """One sorted run in a file, written in blocks of rows."""

    def __init__(self, file: IO[bytes], tier: int, blocks: int) -> None:
        self.file = file
        self.tier = tier
        self.blocks = blocks

    def blocks_in_order(self) -> Iterator[list[Any]]:
        self.file.seek(0)
        for _ in range(self.blocks):
            yield pickle.load(self.file)


class _Cursor(Generic[T]):
    """A run being merged: the rows read from it and not yet taken, with their keys."""

    def __init__(self, blocks: Iterator[list[T]], key: Callable[[T], Any]) -> None:
        self._blocks: Iterator[list[T]] | None = blocks
        self._key = key
        self.rows: list[T] = []
        self.keys: list[Any] = []
        self.pos = 0
        self.read()

    @property
    def more(self) -> bool:
        """Whether the file holds rows not read yet."""
        return self._blocks is not None

    def read(self) -> None:
        """Read the next block (if any), keeping the rows not taken."""
        while self._blocks is not None:
            block = next(self._blocks, None)
            if block is None:
                self._blocks = None
            elif block:
                self.rows = [*self.rows[self.pos:], *block]
                self.keys = [*self.keys[self.pos:], *map(self._key, block)]
                self.pos = 0
                return

    def take_below(self, bound: Any) -> list[T]:
        end = bisect.bisect_left(self.keys, bound, self.pos)
        taken = self.rows[self.pos:end]
        self.pos = end
        if end == len(self.rows):
            self.read()
        return taken


class SpilledRuns(Generic[T]):
    """Sorted runs of rows on disk, merged by ``key`` (the key the runs are sorted
    by). ``directory`` is where the files go (None: the system's temporary
    directory). A run is written and read in blocks of ``block_rows`` rows and
    ``block_bytes`` pickled bytes at most (a row larger than that is a block alone):
    what it holds in memory while it is merged. ``row_bytes`` (about a row's size)
    lets a merge between tiers cut its blocks by size before it has pickled them. Rows
    must pickle; a run is read back by this process only."""

    def __init__(self, key: Callable[[T], Any], *,
                 group_start: Callable[[Any], Any] | None = None,
                 directory: Path | None = None, fan_in: int = 32,
                 block_rows: int = _BLOCK_ROWS, block_bytes: int = _BLOCK_BYTES,
                 row_bytes: Callable[[T], int] | None = None) -> None:
        if fan_in < 2:
            raise ValueError(f"fan_in must be at least 2, got {fan_in}")
        self._block_rows = check_positive_int("block_rows", block_rows)
        self._block_bytes = check_positive_int("block_bytes", block_bytes)
        self._row_bytes = row_bytes
        self._key = key
        self._group_start = group_start or (lambda k: k)
        self._directory = directory
        self._fan_in = fan_in
        self._runs: list[_Run] = []
        self.bytes_written = 0  # by every spill and every merge between tiers

    def spill(self, run: Sequence[T]) -> None:
        """Write out one run, sorted by ``key``; then merge the newest runs while
        ``fan_in`` of them share a tier."""
        self._runs.append(self._write([run], tier=0))
        fan_in = self._fan_in
        while len(self._runs) >= fan_in and len({r.tier for r in self._runs[-fan_in:]}) == 1:
            newest = self._runs[-fan_in:]
            merged = self._write(self._merged([r.blocks_in_order() for r in newest]),
                                 tier=newest[0].tier + 1)
            for old in newest:
                old.file.close()
            self._runs[-fan_in:] = [merged]

    def merge(self, last: Sequence[T] = ()) -> Iterator[list[T]]:
        """Every row spilled, then those of ``last`` (a run kept in memory, sorted by
        ``key``), in one stable sorted order, in lists that each end at a group's end.
        The files are closed when it ends."""
        try:
            yield from self._merged([*(r.blocks_in_order() for r in self._runs),
                                     self._blocks(last)])
        finally:
            self.close()

    def close(self) -> None:
        for run in self._runs:
            run.file.close()
        self._runs = []

    @property
    def files(self) -> int:
        """Runs on disk now."""
        return len(self._runs)

    def _merged(self, runs: list[Iterator[list[T]]]) -> Iterator[list[T]]:
        key, group_start = self._key, self._group_start
        cursors = [_Cursor(blocks, key) for blocks in runs]
        while True:
            unread = [c for c in cursors if c.more]
            if not unread:
                rest = [row for c in cursors for row in c.rows[c.pos:]]
                if rest:
                    yield sorted(rest, key=key)
                return
            # Every row a run has not read has a key at or above the last it read: rows
            # in groups below the smallest such group are all read.
            bound = min(group_start(c.keys[-1]) for c in unread)
            taken = [row for c in cursors for row in c.take_below(bound)]
            if taken:
                yield sorted(taken, key=key)  # stable: equal keys stay in run order
            else:  # the runs holding the bound hold only its group so far: read on
                for c in unread:
                    if c.more and group_start(c.keys[-1]) == bound:
                        c.read()

    def _blocks(self, rows: Sequence[T]) -> Iterator[list[T]]:
        size = self._block_rows
        for i in range(0, len(rows), size):
            yield list(rows[i:i + size])

    def _write(self, batches: Iterable[Sequence[T]], tier: int) -> _Run:
        """A run of the rows of ``batches``, in blocks of ``block_rows``."""
        file = tempfile.TemporaryFile(dir=self._directory)  # noqa: SIM115 - open for the merge
        try:
            size = self._block_rows
            blocks = 0
            pending: list[T] = []
            weight = 0
            for batch in batches:
                pending.extend(batch)
                if self._row_bytes is not None:
                    weight += sum(map(self._row_bytes, batch))
                    if weight >= self._block_bytes:  # rows too large to gather by count
                        for i in range(0, len(pending), size):
                            blocks += self._dump(pending[i:i + size], file)
                        pending, weight = [], 0
                        continue
                if len(pending) >= size:
                    end = len(pending) - len(pending) % size
                    for i in range(0, end, size):
                        blocks += self._dump(pending[i:i + size], file)
                    del pending[:end]
                    weight = 0  # an estimate: the rest starts a block afresh
            if pending:
                blocks += self._dump(pending, file)
            file.flush()
            self.bytes_written += file.tell()
        except BaseException:
            file.close()
            raise
        return _Run(file, tier, blocks)

    def _dump(self, rows: list[T], file: IO[bytes]) -> int:
        """Write ``rows`` as one block, or halved until each block is within
        ``block_bytes``; the number of blocks written."""
        data = pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) <= self._block_bytes or len(rows) == 1:
            file.write(data)
            return 1
        half = len(rows) // 2
        return self._dump(rows[:half], file) + self._dump(rows[half:], file)
