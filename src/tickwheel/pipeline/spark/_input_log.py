"""InputLog: the Spark engine's input files, each given a number once, for its
streaming source (:mod:`tickwheel.pipeline.spark._source`) to read by number.

The source's offsets are these numbers: a micro-batch reads the files numbered from
its start offset up to its end offset, and Spark's offset log holds just the two
numbers. So what Spark keeps per micro-batch does not grow with the files read so
far, and Spark lists no directory: the input is listed here, with
:func:`~tickwheel.pipeline.io.input_dir.input_files` as the local engine lists it (Hadoop would
take ``{}[]*?\\`` in a name as a pattern).

The numbers are kept in ``CHECKPOINT/published.log``, a
:class:`~tickwheel.pipeline.state.batch_log.BatchLog` whose batch id is the next number
and whose records are ``[number, name]``, fsync'd before the offset that covers them
is handed to Spark: a micro-batch run again after a crash reads the same files, and
a file is numbered once. Files are named relative to the input directory, so the same
directory spelled another way (``in/../in``, a symlink) is the same input; a name that
is not a plain file name (``../secret``, an absolute path) is refused, naming the log.

What Spark has committed is written to ``CHECKPOINT/committed.json`` (the number
below which every file is committed), so that the driver can tell which input files
it may delete (:func:`committed_inputs`).

A committed file gone from a listing is forgotten at once, and a ``[-1, name]`` record
says so, so that one written again under the same name is new input, after a restart
too. The log is rewritten once it holds mostly records of files gone.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

from tickwheel.pipeline.io.files import read_bytes_nofollow, write_bytes_atomically
from tickwheel.pipeline.io.input_dir import input_files, is_plain_name
from tickwheel.pipeline.io.log_reader import input_bytes
from tickwheel.pipeline.state.batch_log import BatchLog

__all__ = ["CHANGED_FILES", "COMMITTED_INPUT", "INPUT_GONE", "PUBLISHED_LOG", "SKIPPED_FILES",
           "InputLog", "changed_files", "committed_inputs", "input_gone", "skipped_files"]

log = logging.getLogger(__name__)

PUBLISHED_LOG = "published.log"
#: The input files the last listing skipped, by name, with the reason: written by the
#: streaming source, whose process's log reaches no user, and read by the driver.
SKIPPED_FILES = "skipped.json"
#: Why the input directory could not be listed, while it cannot (a service waits for
#: it): written by the streaming source, read by the driver, as SKIPPED_FILES is.
INPUT_GONE = "input-gone.txt"
#: The input files that changed after they were numbered (size or modification time),
#: with how many changes were seen: written by the source, reported by the driver.
CHANGED_FILES = "changed.json"
#: ``{"next": n}``: every file numbered below n is committed. Written by the source when
#: Spark commits, read by the driver.
COMMITTED_INPUT = "committed.json"
#: Entries the log may hold beyond twice those it must keep before it is rewritten.
_SLACK = 1024
#: The number of a record that forgets a name.
_GONE = -1


class InputLog:
    """The numbered input files of ``input_dir`` for one checkpoint."""

    def __init__(self, input_dir: Path, checkpoint_dir: Path) -> None:
        self.input_dir = input_dir
        self._skipped: dict[str, str] = {}  # input files skipped (see input_files)
        self._skipped_path = checkpoint_dir / SKIPPED_FILES
        self._gone_path = checkpoint_dir / INPUT_GONE
        self._changed_path = checkpoint_dir / CHANGED_FILES
        self._committed_path = checkpoint_dir / COMMITTED_INPUT
        # Each file numbered in this process: (size, mtime) when numbered, to tell one
        # that changed later (its rows written since may not be read).
        self._stats: dict[str, tuple[int, int]] = {}
        self._changed = changed_files(checkpoint_dir)
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self._log = BatchLog(checkpoint_dir / PUBLISHED_LOG)
        self._root = input_dir.absolute()
        self.numbers: dict[str, int] = {}  # input file name -> its number
        # Numbers Spark has not committed yet -> their names: a micro-batch may ask
        # for them again after a crash.
        self.uncommitted: dict[int, str] = {}
        self.committed = 0  # every number below this was committed
        self._bytes: dict[str, int] = {}  # uncommitted paths -> their input_bytes
        for number, name in self._read():
            if number == _GONE:
                self.numbers.pop(name, None)
            else:
                self.numbers[name] = number
                self.uncommitted[number] = name
        self.next_number = max(self._log.last_batch, 0)

    def _read(self) -> list[tuple[int, str]]:
        """The log's records, each checked: a checkpoint names only files inside its
        input directory, whatever was written into it."""
        records = []
        for record in self._log.read():
            if (not isinstance(record, list) or len(record) != 2
                    or not isinstance(record[0], int) or not isinstance(record[1], str)
                    or not is_plain_name(record[1])):
                raise ValueError(f"the checkpoint's {self._log.path} names {record!r}, "
                                 "not a file of its input directory: it was not written by "
                                 "this version of tickwheel; give another --checkpoint")
            records.append((record[0], record[1]))
        return records

    def publish(self) -> int:
        """Number every input file not numbered yet, in name order; returns how many
        were new. They are in the log when this returns."""
        before = dict(self._skipped)
        listed = input_files(self.input_dir, skipped=self._skipped)
        if self._skipped != before or not self._skipped_path.exists():
            # This process's log reaches no user: the driver reports them.
            write_bytes_atomically(json.dumps(self._skipped, sort_keys=True).encode(),
                                   self._skipped_path)
        self._forget_gone({path.name for path in listed})
        self._check_changed(listed)
        new: list[tuple[int, str]] = []
        for path in listed:
            if path.name not in self.numbers:
                new.append((self.next_number + len(new), path.name))
        if new:
            self.next_number += len(new)
            self._log.append(self.next_number, [[number, text] for number, text in new])
            for number, text in new:
                self.numbers[text] = number
                self.uncommitted[number] = text
            log.info("%d new input files (%d in all)", len(new), self.next_number)
        return len(new)

    def _check_changed(self, listed: list[Path]) -> None:
        """Note each numbered file whose size or modification time moved since it was
        numbered (once per change), for the driver to warn of and count."""
        changed = False
        present = set()
        for path in listed:
            name = path.name
            present.add(name)
            try:
                stat = path.stat()
            except OSError:
                continue
            now = (stat.st_size, stat.st_mtime_ns)
            before = self._stats.get(name)
            self._stats[name] = now
            if before is not None and now != before:
                self._changed[name] = self._changed.get(name, 0) + 1
                changed = True
        for name in [n for n in self._stats if n not in present]:
            del self._stats[name]
        if changed:
            write_bytes_atomically(json.dumps(self._changed, sort_keys=True).encode(),
                                   self._changed_path)

    def publish_or_wait(self) -> int:
        """:meth:`publish` for a service: while the input directory is gone (a remount,
        a move), nothing new, and the files numbered are kept so that those coming
        back with it are not read again; the driver is told why."""
        try:
            new = self.publish()
        except FileNotFoundError as exc:
            if not self._gone_path.exists():
                write_bytes_atomically(str(exc).encode(), self._gone_path)
            return 0
        self._gone_path.unlink(missing_ok=True)
        return new

    def files(self, start: int, end: int) -> list[str]:
        """The paths of the files numbered ``start`` up to ``end`` (not included)."""
        try:
            return [str(self._root / self.uncommitted[number])
                    for number in range(start, end)]
        except KeyError as exc:
            raise RuntimeError(f"input file number {exc.args[0]} is not in "
                               f"{self._log.path}: the checkpoint was changed by hand"
                               ) from None

    def end_within(self, start: int, end: int, max_bytes: int) -> int:
        """The end of the files from ``start`` (up to ``end``) that hold ``max_bytes``
        of input at most (:func:`~tickwheel.pipeline.io.log_reader.input_bytes`), one file at
        least."""
        total = 0
        for number, path in enumerate(self.files(start, end), start):
            size = self._bytes.get(path)
            if size is None:
                size = self._bytes[path] = input_bytes(Path(path))
            total += size
            if total > max_bytes and number > start:
                return number
        return end

    def commit(self, end: int) -> None:
        """Spark committed every number below ``end``: they will not be asked for."""
        if end > self.committed:
            self.uncommitted = {number: path for number, path in self.uncommitted.items()
                                if number >= end}
            kept = set(self.uncommitted.values())
            kept = {str(self._root / name) for name in kept}
            self._bytes = {path: size for path, size in self._bytes.items() if path in kept}
            self.committed = end
            write_bytes_atomically(json.dumps({"next": end}).encode(),
                                   self._committed_path)

    def _forget_gone(self, present: set[str]) -> None:
        """Forget the committed files gone from the input directory, in the log too:
        one that comes back under the same name is new input. Rewrites the log once it
        holds twice the records it must keep."""
        gone = sorted(name for name, number in self.numbers.items()
                      if name not in present and number < self.committed)
        if not gone:
            return
        for name in gone:
            del self.numbers[name]
        self._log.append(self.next_number, [[_GONE, name] for name in gone])
        if self._log.records > 2 * len(self.numbers) + _SLACK:
            self._log.rewrite(self.next_number,
                              [[number, name] for name, number in self.numbers.items()])
            log.info("published log rewritten: %d input files kept", len(self.numbers))


def committed_inputs(checkpoint_dir: Path, names: Iterable[str]) -> list[str]:
    """Those of ``names`` (input file names) that Spark has committed: no micro-batch
    asks for them again, and they may be deleted. Reads the log as the source appends
    to it, without repairing it (that is the source's)."""
    try:
        end = int(json.loads(read_bytes_nofollow(checkpoint_dir / COMMITTED_INPUT))["next"])
        published = BatchLog(checkpoint_dir / PUBLISHED_LOG).read(repair=False)
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return []  # none yet, or not a file this engine wrote: none taken as committed
    numbers: dict[str, int] = {}
    for record in published:
        if isinstance(record, list) and len(record) == 2 and isinstance(record[1], str):
            if record[0] == _GONE:
                numbers.pop(record[1], None)
            elif isinstance(record[0], int):
                numbers[record[1]] = record[0]
    return [name for name in names if numbers.get(name, end) < end]


def skipped_files(checkpoint_dir: Path) -> dict[str, str]:
    """The input files the source's last listing skipped (name: reason); none before
    its first."""
    try:
        skipped: dict[str, str] = json.loads(read_bytes_nofollow(checkpoint_dir / SKIPPED_FILES))
    except (FileNotFoundError, ValueError):
        return {}
    return skipped


def input_gone(checkpoint_dir: Path) -> str | None:
    """Why the source could not list the input directory at its last listing, or None."""
    try:
        return read_bytes_nofollow(checkpoint_dir / INPUT_GONE).decode(errors="replace")
    except (FileNotFoundError, ValueError):
        return None


def changed_files(checkpoint_dir: Path) -> dict[str, int]:
    """The input files seen to change after they were numbered, with how many times."""
    try:
        changed: dict[str, int] = json.loads(read_bytes_nofollow(checkpoint_dir / CHANGED_FILES))
    except (FileNotFoundError, ValueError):
        return {}
    return changed
