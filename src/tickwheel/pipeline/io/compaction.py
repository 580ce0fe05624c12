"""Compaction of a follow-mode run's outputs: a service writes a file per batch that
has outcomes (or quarantined rows), up to several a second, and would leave millions
after a few weeks.

Once ``fan_in`` small files are settled (their batches committed, and delivered to a
sink if there is one), they are merged into one ``batches-<first>-<last>.parquet``,
first and last being the batch ids it covers; merged files themselves merge again
while they are under ``max_bytes``, so the count of files grows with the logarithm of
the batches run. The merged file is written whole, fsync'd and renamed into place, and
the rename is on disk, before the files it covers are deleted; a crash in between
leaves both, and the next compaction (every run starts with one) deletes the covered
files first. Rows and their order within each batch are kept.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tickwheel.pipeline.io._arrow import open_parquet
from tickwheel.pipeline.io.files import fsync_directory, read_bytes_nofollow
from tickwheel.pipeline.io.outputs import conform, covered_batches, write_tables_atomically

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["batch_files", "compact", "covered_batches", "settled_batch"]

log = logging.getLogger(__name__)

# One batch's file: the local engine writes one, the Spark engine's executors one per
# partition (batch-<id>-<partition>).

FAN_IN = 64
MAX_BYTES = 64 << 20


def batch_files(directory: Path, batch_id: int) -> list[Path]:
    """The files of one batch in ``directory`` (before any compaction), in name
    order: its partitions' order."""
    return sorted(path for path in directory.glob(f"batch-{batch_id:09d}*.parquet")
                  if covered_batches(path) == (batch_id, batch_id))


def settled_batch(committed: int, delivered_mark: Path) -> int:
    """The last batch whose files may merge: committed, and, once a sink has ever
    been used (its mark exists), delivered too; a later start delivers the files of
    every batch after the mark, one by one. Each target's mark beside it
    (``delivered@<target>``) counts as well."""
    settled = committed
    marks = [delivered_mark, *delivered_mark.parent.glob(delivered_mark.name + "@*")]
    for mark in marks:
        try:
            settled = min(settled, int(read_bytes_nofollow(mark)))
        except (FileNotFoundError, ValueError):
            continue
    return settled


def _level(span: tuple[int, int], path: Path, fan_in: int) -> int:
    """0 for one batch's file (or one of its partitions'); a merged file is 1 and up,
    and a merge of ``fan_in`` files of one level spans at least ``fan_in`` times more
    batches, and so has a higher level."""
    if _is_batch(path):
        return 0
    level, width = 1, span[1] - span[0] + 1
    while width >= fan_in:
        width //= fan_in
        level += 1
    return level


def compact(directory: Path, settled: int, fan_in: int = FAN_IN,
            max_bytes: int = MAX_BYTES) -> int:
    """Merge runs of ``fan_in`` settled files (all of whose batches are at or before
    ``settled``) of one level and under ``max_bytes`` in ``directory``, as long as
    there are any; returns the files merged away. A file is rewritten once per
    level, not once per merge."""
    if fan_in < 2:
        raise ValueError(f"fan_in must be at least 2, got {fan_in}")
    if not directory.is_dir():
        return 0
    files = _finish(directory)
    merged = 0
    while (run := _first_run(files, settled, fan_in, max_bytes)) is not None:
        start, stop = run
        group = files[start:stop]
        first, last = group[0][0][0], group[-1][0][1]
        target = directory / f"batches-{first:09d}-{last:09d}.parquet"
        # A row group at a time: 64 files of up to 64 MB are never held at once. In the
        # newest file's columns: a file lacking a column the contract added gets its
        # value.
        with open_parquet(group[-1][1]) as head:
            schema = head.schema_arrow
        write_tables_atomically(schema, (conform(table, schema) for table in _tables(
            [path for _, path in group])), target)
        # The rename is on disk before any file it covers is deleted.
        fsync_directory(directory)
        for _, path in group:
            path.unlink(missing_ok=True)
        log.info("compacted %d files of %s into %s", len(group), directory, target.name)
        merged += len(group) - 1
        files[start:stop] = [((first, last), target)]
    return merged


def _tables(paths: list[Path]) -> Iterator[pa.Table]:
    import pyarrow as pa

    for path in paths:
        with open_parquet(path) as file:
            for batch in file.iter_batches(use_threads=False):
                yield pa.Table.from_batches([batch])


def _first_run(files: list[tuple[tuple[int, int], Path]], settled: int, fan_in: int,
               max_bytes: int) -> tuple[int, int] | None:
    """Where the first ``fan_in`` files in a row of one level, settled and small,
    are: a merged file covers exactly the files it replaced, never one between."""
    start, level = 0, -1
    for i, (span, path) in enumerate(files):
        if span[1] > settled:
            return None
        here = _level(span, path, fan_in) if path.stat().st_size < max_bytes else -2
        if here != level or here < 0:
            start, level = i, here
        if here >= 0 and i + 1 - start == fan_in:
            return start, i + 1
    return None


def _finish(directory: Path) -> list[tuple[tuple[int, int], Path]]:
    """The output files in batch order, after deleting those a merged file covers
    (left by a crash during a compaction)."""
    files = sorted(((span, path) for path in directory.iterdir()
                    if (span := covered_batches(path)) is not None),
                   key=lambda item: (item[0][0], -item[0][1], _is_batch(item[1]), item[1]))
    kept: list[tuple[tuple[int, int], Path]] = []
    for span, path in files:  # the widest of those starting at a batch comes first
        # Only a merged file covers others: the partitions of one batch do not.
        if kept and span[1] <= kept[-1][0][1] and not _is_batch(kept[-1][1]):
            log.info("deleting %s: %s covers it", path.name, kept[-1][1].name)
            path.unlink(missing_ok=True)
        else:
            kept.append((span, path))
    return kept


def _is_batch(path: Path) -> bool:
    return covered_batches(path) is not None and not path.name.startswith("batches-")
