"""LocalCheckpoint: what the local engine's follow mode keeps, read at start and written
at each batch's commit.

The engine decides; this module only stores. A checkpoint directory holds:

- ``tickwheel.json``: the engine, the format, the input directory and the settings the
  state holds (a run cannot change them);
- ``plan.json``: the next batch's files and clock reading, written before it runs, so
  that a batch cut short runs again the same;
- ``files.log``: the names of the input files read, a
  :class:`~tickwheel.pipeline.state.batch_log.BatchLog`;
- ``keys.log`` and ``ops.log``: each partition's entries, as what each batch changed
  (:class:`~tickwheel.pipeline.state.entry_files.EntryFiles`);
- ``seen/``: the op ids seen, in segments removed past the retention
  (:class:`~tickwheel.pipeline.state.seen_files.SeenFiles`);
- ``state``: the batch committed, both partitions' heads, the last batch each log holds
  and the seen ids' segments that the state relies on. Written last, renamed into
  place: its batch id commits everything before it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from tickwheel.pipeline.io.files import read_bytes_nofollow, write_bytes_atomically
from tickwheel.pipeline.io.input_dir import is_plain_name, same_input
from tickwheel.pipeline.semantics.partition import KeyPartition, OpPartition, PartitionChanges
from tickwheel.pipeline.state.batch_log import BatchLog
from tickwheel.pipeline.state.encoding import (
    LOCAL_CHECKPOINT_FORMAT,
    LOCAL_STATE_FORMAT,
    decode,
    encode,
)
from tickwheel.pipeline.state.entry_files import EntryFiles
from tickwheel.pipeline.state.heads import decode_key_head, decode_op_head, encode_head
from tickwheel.pipeline.state.seen_files import SeenFiles

__all__ = ["BatchPlan", "CheckpointSettings", "LocalCheckpoint", "RestoredState", "file_names"]

T = TypeVar("T")

#: Names the files log may hold beyond twice those it must keep before it is rewritten.
_FILES_LOG_SLACK = 1024


class CheckpointSettings(NamedTuple):
    """What a checkpoint's state is made with: a run cannot change them."""

    lateness_ms: int
    dedupe_retention_ms: int | None
    clock: str  # "event" or "wall"


class RestoredState(NamedTuple):
    """The committed state a checkpoint gave back."""

    batch_id: int
    keys: KeyPartition
    ops: OpPartition


class BatchPlan(NamedTuple):
    """A batch about to run: the input files it reads and the wall clock's reading;
    ``holds_time``: the clock does not move time in it (files wait for later batches)."""

    batch_id: int
    files: list[str]
    clock_ms: int | None
    holds_time: bool = False


def file_names(names: object) -> list[str]:
    """Input file names read from the checkpoint: each must be a plain name, so that a
    checkpoint never points a read outside its input directory."""
    if not isinstance(names, list) or not all(
            isinstance(name, str) and is_plain_name(name) for name in names):
        bad = names if not isinstance(names, list) else next(
            (n for n in names if not (isinstance(n, str) and is_plain_name(n))), names)
        raise ValueError(f"{bad!r} is not the name of a file in the input directory")
    return names


class LocalCheckpoint:
    """The checkpoint in ``directory`` for the input directory ``input_dir``, made with
    ``settings`` (checked against those it names, or written if it is new)."""

    def __init__(self, directory: Path, input_dir: Path,
                 settings: CheckpointSettings) -> None:
        self.directory = directory
        self.settings = settings
        self._settle(input_dir)
        #: Names of the input files the committed batches read.
        self.files_read: set[str] = set()
        self._files_log = BatchLog(directory / "files.log")
        # The op ids seen, with their first watch's ts_ms: the op stage's head leaves
        # them out (a retention bounds them by the rate, not by what is pending).
        self._seen_ids = SeenFiles(directory / "seen", settings.dedupe_retention_ms)
        self._key_log = EntryFiles(directory / "keys.log")
        self._op_log = EntryFiles(directory / "ops.log")
        self.batch_id = -1  # the last batch committed
        #: The bytes the state and its logs hold on disk after the last commit.
        self.state_bytes = 0

    @property
    def state_path(self) -> Path:
        return self.directory / "state"

    @property
    def plan_path(self) -> Path:
        return self.directory / "plan.json"

    def _settle(self, input_dir: Path) -> None:
        meta = self.directory / "tickwheel.json"
        wanted = self.settings._asdict()
        if meta.exists():
            saved = json.loads(read_bytes_nofollow(meta))
            same_input(saved.get("input"), input_dir, self.directory)
            if saved.get("engine") != "local" or saved.get("format") != (
                    LOCAL_CHECKPOINT_FORMAT):
                raise ValueError(
                    f"the checkpoint {self.directory} was not written by this version "
                    f"of the local engine's follow mode (engine {saved.get('engine', 'spark')}"
                    f", format {saved.get('format')}; this one reads format "
                    f"{LOCAL_CHECKPOINT_FORMAT}): give another --checkpoint")
            for name, value in wanted.items():
                if saved.get(name) != value:
                    raise ValueError(f"{name}={value} but the checkpoint "
                                     f"{self.directory} was made with "
                                     f"{name}={saved.get(name)}")
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        write_bytes_atomically(json.dumps({"engine": "local", "format": LOCAL_CHECKPOINT_FORMAT,
                                           "id": uuid.uuid4().hex,
                                           "input": str(input_dir.resolve()),
                                           **wanted}).encode(), meta)

    # -- reading -------------------------------------------------------------------

    def restore(self) -> RestoredState | None:
        """The committed state, its partitions tracking their changes from here on; or
        None for a checkpoint that has committed no batch (what a first batch left
        uncommitted is deleted)."""
        try:
            blob = read_bytes_nofollow(self.state_path)
        except FileNotFoundError:
            self._read_seen_ids(-1, (0, 0))
            return None
        try:
            version, *fields = decode(blob)
        except (EOFError, ValueError, TypeError) as exc:
            raise ValueError(f"the state {self.state_path} cannot be read ({exc}): it was "
                             "not written by tickwheel; give another --checkpoint") from exc
        if version != LOCAL_STATE_FORMAT or len(fields) != 4:
            raise ValueError(f"state version {version} in {self.state_path} is not "
                             f"supported (this version of tickwheel reads "
                             f"{LOCAL_STATE_FORMAT})")
        batch_id, key_head, op_head, relied_on = fields
        self.batch_id = batch_id
        keys = KeyPartition.from_state(decode_key_head(key_head),
                                       self._read_entries(self._key_log))
        self.files_read = set(self._read(f"the checkpoint's log {self._files_log.path}",
                                         lambda: file_names(self._files_log.read(batch_id))))
        seen_ids = self._read_seen_ids(batch_id, relied_on[1])
        ops = OpPartition.from_state(decode_op_head(op_head),
                                     self._read_entries(self._op_log), seen_ids)
        self._check_whole(relied_on)
        self.state_bytes = len(blob) + self._logs_bytes()
        return RestoredState(batch_id, keys, ops)

    def _check_whole(self, relied_on: tuple[dict[str, int], tuple[int, int]]) -> None:
        """Refuse a checkpoint that lacks what its state relies on: a file (copied
        without its ``seen/`` directory, say) or a log's last batches (cut short by hand
        or by a copy that stopped). Read as it is, it would take files already read as
        new input, or forget operations or op ids, without a word."""
        logs, segments = relied_on
        lacking = [short for entries in self._batch_logs()
                   if entries.path.name in logs
                   and (short := entries.short_of(logs[entries.path.name])) is not None]
        lacking += self._seen_ids.lacking(*segments)
        if lacking:
            raise ValueError(f"the checkpoint {self.directory} lacks what its state "
                             f"relies on: {'; '.join(lacking)}. It was copied or changed "
                             "in part; give another --checkpoint or restore the whole of it")

    def _batch_logs(self) -> tuple[BatchLog, ...]:
        return self._files_log, self._key_log.batches, self._op_log.batches

    def _read_entries(self, entries: EntryFiles) -> list[tuple[Any, Any]]:
        return self._read(f"the checkpoint's log {entries.batches.path}",
                          lambda: entries.read(self.batch_id))

    def _read_seen_ids(self, committed: int, segments: object) -> dict[str, int]:
        def read() -> dict[str, int]:
            if not (isinstance(segments, tuple) and len(segments) == 2
                    and all(type(number) is int for number in segments)):
                raise ValueError(f"{segments!r} is not a range of segments")
            return self._seen_ids.read(committed, *segments)

        return self._read(f"the checkpoint {self.directory}", read)

    def _read(self, what: str, read: Callable[[], T]) -> T:
        """``read()`` of a part of the checkpoint, or a clear error naming ``what`` if
        tickwheel did not write it."""
        try:
            return read()
        except (EOFError, ValueError, TypeError) as exc:
            raise ValueError(f"{what} cannot be read ({exc}): it was not written by "
                             "tickwheel; give another --checkpoint") from exc

    # -- the plan --------------------------------------------------------------------

    def planned(self, batch_id: int) -> BatchPlan | None:
        """The plan of ``batch_id`` written before a crash, if there is one."""
        try:
            planned = json.loads(read_bytes_nofollow(self.plan_path))
        except (FileNotFoundError, ValueError):
            return None
        if not isinstance(planned, dict) or planned.get("batch") != batch_id:
            return None
        files = self._read(f"the checkpoint's plan {self.plan_path}",
                           lambda: file_names(planned.get("files")))
        clock_ms = planned.get("clock_ms")
        if clock_ms is not None and type(clock_ms) is not int:
            raise ValueError(f"the checkpoint's plan {self.plan_path} holds a clock reading "
                             f"{clock_ms!r}: it was not written by tickwheel; give another "
                             "--checkpoint")
        holds_time = planned.get("holds_time", False)
        if type(holds_time) is not bool:
            raise ValueError(f"the checkpoint's plan {self.plan_path} holds "
                             f"holds_time={holds_time!r}: it was not written by tickwheel; "
                             "give another --checkpoint")
        return BatchPlan(batch_id, files, clock_ms, holds_time)

    def plan(self, plan: BatchPlan) -> None:
        """Write the plan of the batch about to run."""
        write_bytes_atomically(json.dumps({"batch": plan.batch_id, "files": plan.files,
                                           "clock_ms": plan.clock_ms,
                                           "holds_time": plan.holds_time}).encode(),
                               self.plan_path)

    # -- writing ---------------------------------------------------------------------

    def commit(self, batch_id: int, files: list[str], keys: KeyPartition,
               ops: OpPartition) -> PartitionChanges:
        """The batch's logs, then its state, whose batch id commits them; then what the
        commit lets go (seen ids past the retention, logs due a rewrite). Returns the op
        partition's changes it wrote."""
        key_changes, op_changes = keys.changes(), ops.changes()
        self._files_log.append(batch_id, files)
        self._seen_ids.append(batch_id, op_changes.seen, ops.stage.now)
        self._key_log.append(batch_id, key_changes.entries, keys.entry_bytes)
        self._op_log.append(batch_id, op_changes.entries, ops.entry_bytes)
        state = encode((LOCAL_STATE_FORMAT, batch_id, encode_head(key_changes.head),
                        encode_head(op_changes.head), self._relied_on()))
        write_bytes_atomically(state, self.state_path)
        self.batch_id = batch_id
        self.files_read.update(files)
        self._seen_ids.drop_removed()
        for part, entries in ((keys, self._key_log), (ops, self._op_log)):
            entries.rewrite_if_due(batch_id, part.live_entries(), part.entries,
                                   part.entry_bytes)
        self.state_bytes = len(state) + self._logs_bytes()
        return op_changes

    def _relied_on(self) -> tuple[dict[str, int], tuple[int, int]]:
        """What a state about to be written relies on besides itself: the logs that
        hold records, each with the last batch it holds, and the numbers of the seen
        ids' segments from the first to the next (see :meth:`_check_whole`)."""
        logs = {entries.path.name: entries.last_batch
                for entries in self._batch_logs() if entries.records}
        seen = self._seen_ids.log
        return logs, (seen.first, seen.next)

    def forget_files_gone(self, listed: set[str]) -> None:
        """Forget the names of files gone from the input directory: one that comes
        back under the same name is new input. Rewrites the log once it holds twice
        as many lines as names it must keep."""
        self.files_read &= listed
        if self._files_log.records > 2 * len(self.files_read) + _FILES_LOG_SLACK:
            self._files_log.rewrite(self.batch_id, sorted(self.files_read))

    def _logs_bytes(self) -> int:
        return self._seen_ids.size() + sum(
            entries.batches.path.stat().st_size for entries in (self._key_log, self._op_log)
            if entries.batches.path.exists())
