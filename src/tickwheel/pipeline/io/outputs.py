"""An engine's outputs: outcomes and quarantined rows as Parquet files in
``DIR/outcomes/`` and ``DIR/quarantine/``, with the columns of the event-log contract
so that any tool can compare them, written atomically and read back (also while a
service merges them); and the output directory's ownership. Parquet needs ``pyarrow``
(``pip install 'tickwheel[cli]'``)."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from tickwheel._validate import check_positive_int
from tickwheel.pipeline.contract.events import OutcomeKind, Quarantined
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.io._arrow import open_parquet, pyarrow_modules
from tickwheel.pipeline.io.files import is_temporary_of, open_temporary, read_bytes_nofollow
from tickwheel.pipeline.io.input_dir import within
from tickwheel.pipeline.io.ownership import LOCK_FILE, RunOwner, hold_run_directories

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["DEAD_LETTERS", "DEFAULT_CHECKPOINT", "OUTPUT_SUBDIRS", "OWNER_EPOCH_KEY",
           "OWNER_FILE", "REPORT_FILE", "OutputDirError", "OutputWriter", "checkpoint_id",
           "conform", "count_outputs", "covered_batches", "outcome_rows", "outcome_size",
           "outcome_writer", "outcomes_table", "output_owner", "owner_epoch",
           "owner_metadata", "prepare_output", "quarantine_table",
           "quarantine_writer", "quarantined_size", "read_outcomes", "read_output_table",
           "read_parquet_rows", "recent_outcomes", "take_output", "write_atomically",
           "write_outcomes", "write_quarantine", "write_tables_atomically"]

#: What an engine writes into its output directory: these, and the checkpoint when it
#: is the default ``OUTPUT/_checkpoint``.
OUTPUT_SUBDIRS = ("outcomes", "quarantine")
#: Which Spark checkpoint the outputs beside it belong to.
OWNER_FILE = "_tickwheel-output.json"
#: The plot ``tickwheel report`` writes by default.
REPORT_FILE = "report.png"
DEFAULT_CHECKPOINT = "_checkpoint"
#: Where a webhook's refused deliveries go (tickwheel.service.webhook).
DEAD_LETTERS = "dead-letter"
#: The key, in a batch output file's metadata, of the epoch of the owner that wrote it.
OWNER_EPOCH_KEY = "tickwheel.owner_epoch"
# The files an engine writes in outcomes/ and quarantine/ (and the Spark engine's
# temporary files on their way there): nothing else is read as output.
_OUTPUT_FILE = re.compile(r"(part-00000|batch-\d{9}(-\d{5})?|batches-\d{9}-\d{9})\.parquet"
                          r"|\.(part-00000|batch-\d{9}|batches-\d{9}-\d{9})\.parquet"
                          r"\.[0-9a-f]{8}\.tmp"
                          r"|\.batch-\d{9}-\d{5}\.\d+\.[0-9a-f]{8}\.tmp")
# A batch's file of outputs (a partition's file of it), and a merged run's.
_BATCH = re.compile(r"batch-(\d{9})(?:-\d{5})?\.parquet")
_MERGED = re.compile(r"batches-(\d{9})-(\d{9})\.parquet")
_OUTCOME_COLUMNS = ("op_id", "outcome", "resolved_ms", "latency_ms", "keys", "error",
                    "skipped", "target", "payload")
_QUARANTINE_COLUMNS = ("raw", "reason", "ts_ms")
# A dict lookup: OutcomeKind(value) goes through the enum's Python-level lookup.
_OUTCOMES = {o.value: o for o in OutcomeKind}
R = TypeVar("R")


class OutputDirError(ValueError):
    """The output directory holds something its run did not write (refused before any
    work: mixing files in would corrupt the result)."""


def outcomes_table(rows: list[OutcomeRow]) -> pa.Table:
    """Outcomes in the contract's columns, as both engines write them."""
    pa, _ = pyarrow_modules()
    return pa.table({
        "op_id": pa.array([r.op_id for r in rows], pa.string()),
        # `_value_`: an enum's `.value` is a Python-level descriptor, and this runs
        # once a row of every batch; the member's own attribute is a plain read.
        "outcome": pa.array([r.outcome._value_ for r in rows], pa.string()),
        "resolved_ms": pa.array([r.resolved_ms for r in rows], pa.int64()),
        "latency_ms": pa.array([r.latency_ms for r in rows], pa.int64()),
        # The tuples as they are: pyarrow takes them, and a list of each is a copy.
        "keys": pa.array([r.keys for r in rows], pa.list_(pa.string())),
        "error": pa.array([r.error for r in rows], pa.string()),
        "skipped": pa.array([r.skipped for r in rows], pa.int64()),
        "target": pa.array([r.target for r in rows], pa.string()),
        # The JSON text: any JSON value, as one column every Parquet reader takes.
        "payload": pa.array([r.payload for r in rows], pa.string()),
    })


def quarantine_table(rows: list[Quarantined]) -> pa.Table:
    """Quarantined rows in the contract's columns, as both engines write them."""
    pa, _ = pyarrow_modules()
    return pa.table({
        "raw": pa.array([q.raw for q in rows], pa.string()),
        "reason": pa.array([q.reason.value for q in rows], pa.string()),
        "ts_ms": pa.array([q.ts_ms for q in rows], pa.int64()),
    })


def outcome_rows(table: pa.Table) -> list[OutcomeRow]:
    """The rows of an outcomes table (the contract's columns)."""
    c = table.to_pydict()
    none: list[Any] = [None] * len(c["op_id"])
    skipped = c.get("skipped") or [0] * len(c["op_id"])
    return [OutcomeRow(op_id, _OUTCOMES[outcome], resolved, latency, tuple(keys), error,
                       skips, target, payload)
            for op_id, outcome, resolved, latency, keys, error, skips, target, payload in zip(
                c["op_id"], c["outcome"], c["resolved_ms"], c["latency_ms"], c["keys"],
                c["error"], skipped, c.get("target") or none, c.get("payload") or none,
                strict=True)]


def write_outcomes(rows: list[OutcomeRow], directory: Path) -> Path:
    with outcome_writer(directory) as writer:
        writer.write(rows)
    return writer.path


def write_quarantine(rows: list[Quarantined], directory: Path) -> Path:
    with quarantine_writer(directory) as writer:
        writer.write(rows)
    return writer.path


def outcome_writer(directory: Path) -> OutputWriter[OutcomeRow]:
    """An :class:`OutputWriter` of outcomes, weighing each by its strings."""
    return OutputWriter(directory, outcomes_table, row_bytes=outcome_size)


def quarantine_writer(directory: Path) -> OutputWriter[Quarantined]:
    """An :class:`OutputWriter` of quarantined rows, weighing each by its line."""
    return OutputWriter(directory, quarantine_table, row_bytes=quarantined_size)


def outcome_size(row: OutcomeRow) -> int:
    """About the bytes an outcome takes, to cut output into pieces of bounded size."""
    return (64 + len(row.op_id) + sum(map(len, row.keys)) + len(row.error or "")
            + len(row.payload or ""))


def quarantined_size(row: Quarantined) -> int:
    """About the bytes a quarantined row takes (its line is most of it)."""
    return 64 + len(row.raw)


def owner_metadata(epoch: int) -> dict[str, str]:
    """The file metadata that says which owner of the checkpoint wrote a batch's
    output: its epoch (see :mod:`tickwheel.pipeline.io.ownership`)."""
    return {OWNER_EPOCH_KEY: str(epoch)}


def owner_epoch(path: Path) -> int | None:
    """The epoch of the owner that wrote the output file ``path``, if it says."""
    _, pq = pyarrow_modules()
    metadata = pq.read_schema(path).metadata or {}
    value = metadata.get(OWNER_EPOCH_KEY.encode())
    return None if value is None else int(value)


def write_atomically(table: pa.Table, path: Path,
                     metadata: Mapping[str, str] | None = None) -> None:
    """A Parquet file written whole and fsync'd under a hidden name (which no reader
    takes), then renamed into place: a crash, even of the machine, leaves the old file
    or the new one, never half; and a batch's outputs are on disk before the state that
    commits the batch (which is fsync'd after them). ``metadata`` goes in the file's
    schema."""
    write_tables_atomically(table.schema, [table], path, metadata)


def write_tables_atomically(schema: pa.Schema, tables: Iterable[pa.Table], path: Path,
                            metadata: Mapping[str, str] | None = None) -> None:
    """:func:`write_atomically` for tables that come one at a time, each its own row
    group: a merge of files never holds them all."""
    _, pq = pyarrow_modules()
    if metadata:
        schema = schema.with_metadata(dict(metadata))
    path.parent.mkdir(parents=True, exist_ok=True)
    out, tmp = open_temporary(path)
    try:
        with out:
            with pq.ParquetWriter(out, schema) as writer:
                for table in tables:
                    writer.write_table(table)
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


class OutputWriter(Generic[R]):
    """Rows written to ``directory/name`` as they come, a row group at a time, so that
    a run's outputs need not fit in memory. The file is written under a hidden name of
    its own (``tmp_prefix`` and random digits; by default ``.<name>.``), then
    fsync'd and renamed into place when the writer closes without an error; an error
    removes it. ``to_table`` makes a list of rows into the contract's columns
    (:func:`outcomes_table`, :func:`quarantine_table`); :meth:`write_table` takes rows
    already in them. A row group holds ``group_rows`` rows, or fewer once
    ``row_bytes`` (a row's size, roughly) adds up to ``group_bytes``: rows of up to a
    megabyte of text each (a quarantined row keeps its line) must not be held 65,536
    at a time."""

    def __init__(self, directory: Path, to_table: Callable[[list[R]], pa.Table], *,
                 group_rows: int = 65_536, row_bytes: Callable[[R], int] | None = None,
                 group_bytes: int = 16 << 20, name: str = "part-00000.parquet",
                 tmp_prefix: str | None = None,
                 metadata: Mapping[str, str] | None = None) -> None:
        _, pq = pyarrow_modules()
        self.path = directory / name
        self.rows = 0
        self._to_table = to_table
        self._group_rows = check_positive_int("group_rows", group_rows)
        self._row_bytes = row_bytes
        self._group_bytes = check_positive_int("group_bytes", group_bytes)
        self._pending: list[R] = []
        self._pending_bytes = 0
        directory.mkdir(parents=True, exist_ok=True)
        self._file, self._tmp = open_temporary(self.path, tmp_prefix)
        try:
            schema = to_table([]).schema
            if metadata:
                schema = schema.with_metadata(dict(metadata))
            self._writer = pq.ParquetWriter(self._file, schema)
        except BaseException:
            self._file.close()
            self._tmp.unlink(missing_ok=True)
            raise

    def write(self, rows: Iterable[R]) -> None:
        pending = self._pending
        size = self._row_bytes
        if size is None:
            pending.extend(rows)
        else:
            for row in rows:
                pending.append(row)
                self._pending_bytes += size(row)
                if self._pending_bytes >= self._group_bytes:
                    self._write_group(pending)
                    pending.clear()
                    self._pending_bytes = 0
        while len(pending) >= self._group_rows:
            self._write_group(pending[:self._group_rows])
            del pending[:self._group_rows]
            self._pending_bytes = 0  # an estimate: the rest starts a group afresh

    def write_table(self, table: pa.Table) -> None:
        """Rows already in the contract's columns, after those written before."""
        if self._pending:
            self._write_group(self._pending)
            self._pending = []
            self._pending_bytes = 0
        self._writer.write_table(table, row_group_size=self._group_rows)
        self.rows += table.num_rows

    def close(self) -> None:
        """The file, whole, in place."""
        if self._pending or self.rows == 0:  # an empty output still gets its file
            self._write_group(self._pending)
            self._pending = []
        self._writer.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """No file: what was written is removed."""
        try:
            self._writer.close()
        finally:
            self._file.close()
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> OutputWriter[R]:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()

    def _write_group(self, rows: list[R]) -> None:
        self._writer.write_table(self._to_table(rows))
        self.rows += len(rows)


def read_outcomes(path: Path, *, batch_rows: int = 65_536) -> Iterator[OutcomeRow]:
    """The outcomes of one output file, read ``batch_rows`` at a time."""
    pa, _ = pyarrow_modules()
    with open_parquet(path) as file:
        names = file.schema_arrow.names
        columns = [c for c in _OUTCOME_COLUMNS if c in names]  # older files lack some
        for batch in file.iter_batches(batch_rows, columns=columns, use_threads=False):
            yield from outcome_rows(pa.Table.from_batches([batch]))


def read_parquet_rows(directory: Path) -> list[dict[str, Any]]:
    """Rows of every output file in ``directory`` (an engine's ``outcomes/`` or
    ``quarantine/``), as Python objects: for tests and small outputs
    (:func:`read_output_table` and :func:`count_outputs` read large ones). A file there
    that no engine wrote, or without the contract's columns, raises
    :class:`OutputDirError` naming it."""
    columns = _QUARANTINE_COLUMNS if directory.name == "quarantine" else _OUTCOME_COLUMNS
    rows: list[dict[str, Any]] = read_output_table(directory, columns).to_pylist()
    return rows


def read_output_table(directory: Path, columns: Sequence[str]) -> pa.Table:
    """The ``columns`` of every output file in ``directory``, as one Arrow table (in
    file order; empty if there is none): the other columns are never read. A file
    there that no engine wrote, or without these columns, raises
    :class:`OutputDirError` naming it."""
    pa, _ = pyarrow_modules()
    tables = _reread_if_changed(directory, lambda: [
        table for _, table in _output_tables(directory, columns)])
    if not tables:
        empty = quarantine_table([]) if directory.name == "quarantine" else outcomes_table([])
        return empty.select(list(columns))
    return pa.concat_tables(tables, promote_options="permissive")


def count_outputs(directory: Path, column: str) -> dict[str, int]:
    """How many rows of the output files in ``directory`` hold each value of
    ``column`` (an outcome's ``outcome``, a quarantined row's ``reason``), read from
    that column alone, a file at a time."""
    pyarrow_modules()
    import pyarrow.compute as pc

    def count() -> dict[str, int]:
        counts: dict[str, int] = {}
        for _, table in _output_tables(directory, [column]):
            for item in pc.value_counts(table.column(0)).to_pylist():
                counts[item["values"]] = counts.get(item["values"], 0) + item["counts"]
        return counts

    return dict(sorted(_reread_if_changed(directory, count).items()))


class _Vanished(Exception):
    """A file listed was gone when it was read: a running service merged it."""


_R = TypeVar("_R")
#: Reads of a directory a service keeps compacting before giving up.
_READS = 5


def _reread_if_changed(directory: Path, read: Callable[[], _R]) -> _R:
    for _ in range(_READS):
        try:
            return read()
        except _Vanished:
            continue
    raise OutputDirError(f"{directory} changed under each of {_READS} reads: a running "
                         "service is merging its files; try again")


def covered_batches(path: Path) -> tuple[int, int] | None:
    """The first and last batch ids a file of outputs covers, or None."""
    if m := _BATCH.fullmatch(path.name):
        return int(m.group(1)), int(m.group(1))
    if m := _MERGED.fullmatch(path.name):
        return int(m.group(1)), int(m.group(2))
    return None


def _merged_away(paths: list[Path]) -> set[Path]:
    """The files of ``paths`` that a merged file among them covers: a merge's file is
    renamed into place before the files it merged are removed, and a reader that
    listed both in between would count their rows twice."""
    ranges = {path: span for path in paths if (span := covered_batches(path)) is not None}
    merged = [(path, span) for path, span in ranges.items()
              if _MERGED.fullmatch(path.name) is not None]
    return {path for path, (first, last) in ranges.items()
            if any(other != path and low <= first and last <= high
                   for other, (low, high) in merged)}


def recent_outcomes(directory: Path, since_ms: int, limit: int,
                    ) -> list[tuple[str, str, int, int]]:
    """``(op_id, outcome, resolved_ms, latency_ms)`` of the outcomes in ``directory``
    resolved at or after ``since_ms``, oldest first, at most the newest ``limit``. The
    files are read newest first, and no further than the first whose outcomes are all
    older: batches resolve in time order, so what a start reads is bounded by the
    window, not by the history the directory holds."""

    def read() -> list[tuple[str, str, int, int]]:
        found: list[list[tuple[str, str, int, int]]] = []
        total = 0
        for _, table in _output_tables(directory, _RECENT_COLUMNS, newest_first=True):
            resolved = table.column("resolved_ms").to_pylist()
            if resolved and max(resolved) < since_ms:
                break
            rows = [row for row in zip(table.column("op_id").to_pylist(),
                                       table.column("outcome").to_pylist(), resolved,
                                       table.column("latency_ms").to_pylist(), strict=True)
                    if row[2] >= since_ms]
            found.append(rows)
            total += len(rows)
            if total >= limit:
                break
        kept = [row for rows in reversed(found) for row in rows]
        return kept[-limit:] if limit else []

    return _reread_if_changed(directory, read)


_RECENT_COLUMNS = ("op_id", "outcome", "resolved_ms", "latency_ms")


def _output_tables(directory: Path, columns: Sequence[str], newest_first: bool = False,
                   ) -> Iterator[tuple[Path, pa.Table]]:
    pa, _ = pyarrow_modules()
    if not directory.is_dir():
        return
    paths = sorted(directory.iterdir(), reverse=newest_first)
    covered = _merged_away(paths)
    for path in paths:
        if path.name.startswith(".") or path in covered:
            continue  # a write in progress; rows a merged file holds too
        if not _OUTPUT_FILE.fullmatch(path.name):
            raise OutputDirError(f"{path} was not written by tickwheel")
        try:
            with open_parquet(path) as file:
                names = file.schema_arrow.names
                missing = [c for c in columns if c not in names and c not in _ADDED]
                if missing:
                    raise OutputDirError(f"{path} lacks the columns {', '.join(missing)}")
                table = file.read(columns=[c for c in columns if c in names],
                                  use_threads=False)
                for name in columns:
                    if name not in names:  # a column the contract added since
                        table = table.append_column(name, pa.array(
                            [_ADDED[name]] * table.num_rows, _added_type(name)))
                table = table.select(list(columns))
        except FileNotFoundError:
            raise _Vanished(path) from None
        except (pa.ArrowException, OSError) as exc:
            shown = " ".join(str(exc).split())  # one line
            raise OutputDirError(f"{path} cannot be read as the Parquet file tickwheel "
                                 f"wrote there: {shown}") from None
        _check_columns(path, table)
        yield path, table


#: Columns added to the contract since its first version, with the value a file
#: written before them holds.
_ADDED: dict[str, int | None] = {"skipped": 0, "target": None, "payload": None}


def _added_type(name: str) -> pa.DataType:
    schema = outcomes_table([]).schema
    return schema.field(name).type


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` in ``schema``'s columns: a table lacking a column the contract added
    (:data:`_ADDED`) gets it, with that column's value for such rows."""
    pa, _ = pyarrow_modules()
    if table.schema.names == schema.names:
        return table
    for name in schema.names:
        if name not in table.schema.names:
            if name not in _ADDED:
                raise OutputDirError(f"an output file lacks the column {name}")
            table = table.append_column(schema.field(name), pa.array(
                [_ADDED[name]] * table.num_rows, schema.field(name).type))
    return table.select(schema.names)
#: Columns an engine never leaves empty.
_NOT_NULL = frozenset({"op_id", "outcome", "resolved_ms", "latency_ms", "raw", "reason",
                       "skipped"})


def _check_columns(path: Path, table: pa.Table) -> None:
    """Refuse a file whose columns are not the contract's: another type, or nulls where
    an engine writes none (a report would misread them)."""
    contract = (quarantine_table([]) if path.parent.name == "quarantine"
                else outcomes_table([])).schema
    for field in table.schema:
        index = contract.get_field_index(field.name)
        if index >= 0 and not field.type.equals(contract.field(index).type):
            raise OutputDirError(f"{path}: column {field.name} holds {field.type}, not "
                                 f"{contract.field(index).type}: tickwheel did not write it")
        nulls = table.column(field.name).null_count
        if nulls and field.name in _NOT_NULL:
            raise OutputDirError(f"{path}: column {field.name} holds {nulls:,} nulls: "
                                 "tickwheel did not write it")


def checkpoint_id(checkpoint: Path) -> str | None:
    """The id of a Spark engine's checkpoint (None for a new one)."""
    try:
        return str(json.loads(read_bytes_nofollow(checkpoint / "tickwheel.json"))["id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def output_owner(output: Path) -> str | None:
    """The id of the Spark checkpoint whose outputs ``output`` holds, if any."""
    try:
        return str(json.loads(read_bytes_nofollow(output / OWNER_FILE))["checkpoint"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def take_output(output: Path, *, overwrite: bool, checkpoint: Path | None = None) -> RunOwner:
    """Hold ``output`` (and ``checkpoint``) for this run, then :func:`prepare_output`;
    a refusal lets go of the holds and of the directories they created."""
    owner = hold_run_directories(output, checkpoint)
    try:
        prepare_output(output, overwrite=overwrite, checkpoint=checkpoint,
                       checkpoint_id=None if checkpoint is None else checkpoint_id(checkpoint))
    except BaseException:
        owner.abandon()
        raise
    return owner


def prepare_output(output: Path, *, overwrite: bool, checkpoint: Path | None = None,
                   checkpoint_id: str | None = None) -> None:
    """Make ``output`` ready for a run, or refuse it with :class:`OutputDirError`.

    The local engine (``checkpoint`` None) takes only an empty or new directory. The
    Spark engine also takes the outputs of its own checkpoint (``checkpoint_id``, None
    for a new one), so that a run goes on where the last one stopped. ``overwrite``
    removes earlier outputs (and the default checkpoint inside ``output``) first; other
    files are left alone and never read."""
    if output.exists() and not output.is_dir():
        raise OutputDirError(f"output {output} exists and is not a directory")
    inside = checkpoint is not None and within(checkpoint.absolute(), output.absolute())
    if overwrite:
        for name in (*OUTPUT_SUBDIRS, DEAD_LETTERS, OWNER_FILE, REPORT_FILE):
            target = output / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
        held = [] if checkpoint is None or not checkpoint.is_dir() else [
            p for p in checkpoint.iterdir() if p.name != LOCK_FILE]
        if held:
            if not inside:
                raise OutputDirError(
                    f"--overwrite starts afresh, but the checkpoint {checkpoint} is not "
                    f"inside {output}: delete it or give a new one")
            # Its lock file stays: this run holds it (pipeline/io/ownership.py).
            for path in held:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        return
    if not output.is_dir():
        return
    ours = {*OUTPUT_SUBDIRS, DEAD_LETTERS, LOCK_FILE}
    if checkpoint is not None:
        ours |= {OWNER_FILE, REPORT_FILE, DEFAULT_CHECKPOINT}
        if inside:
            ours.add(checkpoint.relative_to(output).parts[0])
    strangers = sorted(p.name for p in output.iterdir() if p.name not in ours
                       and not is_temporary_of(p.name, f".{OWNER_FILE}."))
    if strangers:
        raise OutputDirError(
            f"output {output} holds files a run did not write ({', '.join(strangers[:3])}"
            f"{', ...' if len(strangers) > 3 else ''}): give an empty or new directory, "
            "or --overwrite")
    written = [p for sub in OUTPUT_SUBDIRS if (output / sub).is_dir()
               for p in sorted((output / sub).iterdir())]
    for path in written:
        if not _OUTPUT_FILE.fullmatch(path.name):
            raise OutputDirError(f"{path} was not written by tickwheel: remove it, or "
                                 "--overwrite")
    if written and (checkpoint is None or checkpoint_id is None
                    or output_owner(output) != checkpoint_id):
        whose = "an earlier run" if checkpoint is None else "another checkpoint"
        raise OutputDirError(f"output {output} holds the outputs of {whose}: give an empty "
                             "or new directory, or --overwrite")
