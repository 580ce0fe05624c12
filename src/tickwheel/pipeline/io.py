"""Reading event directories and writing outcomes and quarantine as Parquet.

Input files are ``*.jsonl``, ``*.json`` (either gzip'd as ``*.jsonl.gz``, ``*.json.gz``)
and ``*.parquet`` in name order (names starting with ``.`` or ``_`` are not input); both
engines write ``DIR/outcomes/`` and ``DIR/quarantine/`` with the columns of the
event-log contract, so any tool can compare them. Parquet needs ``pyarrow`` (``pip
install 'tickwheel[cli]'``).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shutil
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Generic, Protocol, TypeVar

from tickwheel._validate import check_positive_int
from tickwheel.pipeline.events import (
    MAX_ROW_CHARS,
    Event,
    OutcomeKind,
    Quarantined,
    Reason,
    Wire,
    is_utf8,
    parse_line,
    parse_row,
    parse_wire,
    to_wire,
)
from tickwheel.pipeline.reference import OutcomeRow

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["HADOOP_GLOB_CHARS", "INPUT_NAMES", "ByteStream", "InputError", "OutputDirError",
           "OutputWriter", "check_spark_paths", "checkpoint_id", "count_outputs",
           "covered_batches", "input_bytes",
           "input_dir_problem", "input_files", "is_input_name", "json_lines", "json_stream",
           "open_input", "open_parquet", "outcome_rows",
           "outcome_size", "outcome_writer", "outcomes_table", "output_owner", "parquet_events",
           "prepare_output", "quarantine_table", "quarantine_writer", "quarantined_size",
           "read_events", "read_outcomes", "read_output_table", "read_parquet_rows", "read_wire",
           "within", "write_atomically", "write_outcomes", "write_quarantine",
           "write_tables_atomically"]

log = logging.getLogger(__name__)

SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".parquet")
GZIP_SUFFIX = ".gz"
#: The input files' names, as messages give them.
INPUT_NAMES = "files named *.jsonl or *.json (gzip'd or not) or *.parquet"
_COMPRESSED = (".bz2", ".xz", ".zst", ".zstd", ".lz4", ".zip", ".snappy", ".br")

#: What an engine writes into its output directory: these, and the checkpoint when it
#: is the default ``OUTPUT/_checkpoint``.
OUTPUT_SUBDIRS = ("outcomes", "quarantine")
#: Which Spark checkpoint the outputs beside it belong to.
OWNER_FILE = "_tickwheel-output.json"
#: The plot ``tickwheel report`` writes by default.
REPORT_FILE = "report.png"
DEFAULT_CHECKPOINT = "_checkpoint"
# The files an engine writes in outcomes/ and quarantine/ (and the Spark engine's
# temporary files on their way there): nothing else is read as output.
_OUTPUT_FILE = re.compile(r"(part-00000|batch-\d{9}(-\d{5})?|batches-\d{9}-\d{9})\.parquet"
                          r"|\.(part-00000|batch-\d{9}|batches-\d{9}-\d{9})\.tmp"
                          r"|\.batch-\d{9}-\d{5}\.\d+\.tmp")
# A batch's file of outputs (a partition's file of it), and a merged run's.
_BATCH = re.compile(r"batch-(\d{9})(?:-\d{5})?\.parquet")
_MERGED = re.compile(r"batches-(\d{9})-(\d{9})\.parquet")
_OUTCOME_COLUMNS = ("op_id", "outcome", "resolved_ms", "latency_ms", "keys", "error")
_QUARANTINE_COLUMNS = ("raw", "reason", "ts_ms")
# A dict lookup: OutcomeKind(value) goes through the enum's Python-level lookup.
_OUTCOMES = {o.value: o for o in OutcomeKind}
R = TypeVar("R")


#: Characters Hadoop takes as a glob pattern in a path, both where Spark's file source
#: lists a directory and where it reads each file listed. The Spark engine lists the
#: input itself (see ``spark._input_log``); only its checkpoint, where its sources
#: list tickwheel's own files, must be free of them.
HADOOP_GLOB_CHARS = frozenset("{}[]*?\\")


class InputError(ValueError):
    """An input the engines cannot read the same way (refused before any work)."""


class OutputDirError(ValueError):
    """The output directory holds something its run did not write (refused before any
    work: mixing files in would corrupt the result)."""


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("Parquet needs pyarrow: pip install 'tickwheel[cli]'") from exc
    return pa, pq


@contextlib.contextmanager
def open_parquet(path: Path) -> Iterator[Any]:
    """``pyarrow.parquet.ParquetFile`` over a file Python opened: pyarrow encodes a
    path as UTF-8, which a name holding a byte that is not (a surrogate) cannot be."""
    _, pq = _pyarrow()
    with open(path, "rb") as raw, pq.ParquetFile(raw) as file:
        yield file


def is_input_name(name: str) -> bool:
    """Whether the engines read a file so named: a log's suffix, and not hidden (a file
    being written is renamed into place from a hidden name)."""
    return name.endswith(SUFFIXES) and not name.startswith((".", "_"))


def input_dir_problem(directory: Path) -> str | None:
    """Why ``directory`` cannot be an input directory, or None if it can."""
    if directory.is_dir():
        return None
    if directory.is_symlink() and not directory.exists():
        return f"input directory {directory} is a symlink to nothing"
    if directory.exists():
        return f"input {directory} is not a directory"
    return f"input directory {directory} does not exist"


def input_files(directory: Path, *, skipped: dict[str, str] | None = None,
                warn: bool = True) -> list[Path]:
    """The input files of ``directory``, in name order, as both engines read them.

    A symlink is followed only while it points inside ``directory``: one that leads
    elsewhere, or to nothing (dangling, or a loop), is skipped and logged, so an input
    directory never copies a file from outside it into the quarantine. A directory or
    a pipe with an input file's name is skipped and logged too, and so is a file whose
    name is not a log's (``notes.csv``, ``events.jsonl.gz``); a hidden name (``.`` or
    ``_`` first) is a file being written, left out unlogged. A name that is
    not valid UTF-8 raises :class:`InputError` (refused before any work), unless
    ``skipped`` is given: a running service's listing skips such a file instead of
    stopping, and logs each name it skips once while the name stays: ``skipped``
    holds the names skipped at the last listing, each with the reason. ``warn=False``
    logs none: a check before the listing that reads, which logs them."""
    problem = input_dir_problem(directory)
    if problem is not None:
        raise FileNotFoundError(problem)
    root = directory.resolve()
    files = []
    skipping: dict[str, str] = {}
    for path in sorted(directory.iterdir()):
        name = path.name
        if not is_input_name(name):
            # A hidden name is a file on its way in; any other file is said to be
            # left unread, so that a log kept as .csv or .jsonl.gz is not lost silently.
            if not name.startswith((".", "_")) and path.is_file():
                _skip(path, _unread_reason(name), skipped, skipping, warn)
            continue
        if not is_utf8(name):  # undecodable bytes come as lone surrogates
            if skipped is None:
                raise InputError(f"input file name {name!r} in {directory} is not valid "
                                 "UTF-8: rename it")
            _skip(path, "its name is not valid UTF-8: rename it", skipped, skipping, warn)
            continue
        if path.is_symlink():
            try:
                target = path.resolve(strict=True)
            except (OSError, RuntimeError):  # RuntimeError: a loop, before Python 3.13
                _skip(path, "a symlink that leads to no file", skipped, skipping, warn)
                continue
            if not within(target, root):
                _skip(path, f"a symlink to {str(target)!r}, outside the input directory", skipped,
                      skipping, warn)
                continue
        if not path.is_file():
            # Spark writes a "file" as a directory of parts: say they are not read.
            _skip(path, "a directory, not a file: files in it are not read" if path.is_dir()
                  else "not a regular file (a pipe, socket or device)", skipped, skipping,
                  warn)
            continue
        files.append(path)
    if skipped is not None:
        skipped.clear()
        skipped.update(skipping)
    return files


def _unread_reason(name: str) -> str:
    base, _, suffix = name.rpartition(".")
    if base.endswith((".jsonl", ".json")) and f".{suffix}" in _COMPRESSED:
        return f"compressed with .{suffix}, which is not read: the engines read {INPUT_NAMES}"
    return f"not a log: the engines read {INPUT_NAMES}"


def _skip(path: Path, why: str, skipped: dict[str, str] | None,
          skipping: dict[str, str], warn: bool) -> None:
    if warn and (skipped is None or path.name not in skipped):
        log.warning("skipping input file %r: %s", str(path), why)
    skipping[path.name] = why


def check_spark_paths(directory: Path, checkpoint: Path, output: Path | None = None,
                      ) -> list[Path]:
    """:func:`input_files` for the Spark engine, which also refuses a checkpoint path
    that its file sources would take as a glob pattern (see :data:`HADOOP_GLOB_CHARS`),
    and a path holding a byte that is not UTF-8, which the JVM cannot name. Input
    paths may hold any other character: the engine lists them itself."""
    for what, path in (("input", directory), ("checkpoint", checkpoint), ("output", output)):
        if path is None:
            continue
        try:
            os.fspath(path).encode("utf-8")
        except UnicodeError:
            shown = os.fsencode(path).decode("utf-8", "backslashreplace")
            raise InputError(f"the Spark engine cannot use the {what} path {shown}: it holds "
                             "a byte that is not UTF-8, and the JVM names files in "
                             "Unicode; use the local engine or another path") from None
    files = input_files(directory, warn=False)  # the engine's own listing warns
    where = str(checkpoint.absolute())
    bad = sorted(HADOOP_GLOB_CHARS & set(where))
    if bad:
        raise InputError(f"the Spark engine cannot keep its checkpoint in {where!r}: Hadoop "
                         f"takes {' '.join(bad)} in a path as a pattern; choose another "
                         "place with --checkpoint")
    return files


def within(path: Path, directory: Path) -> bool:
    """Whether ``path`` is ``directory`` or under it (both resolved by the caller)."""
    return path == directory or directory in path.parents



def read_events(directory: Path, *, max_chars: int = MAX_ROW_CHARS,
                on_bytes: Callable[[int], object] | None = None,
                ) -> Iterator[Event | Quarantined]:
    """Every row of every input file, in file order; blank lines are not rows. A JSON
    Lines file is read as :func:`json_lines` reads it, a line longer than
    ``max_chars`` cut (a ``too_long`` row). ``on_bytes`` hears of the bytes read as
    they are (for progress): a JSON Lines file's a slice at a time, a Parquet file's
    once read."""
    check_positive_int("max_chars", max_chars)
    return _rows(directory, max_chars, on_bytes, parse_line, _as_is)


def read_wire(directory: Path, *, max_chars: int = MAX_ROW_CHARS,
              on_bytes: Callable[[int], object] | None = None) -> Iterator[Wire]:
    """:func:`read_events`, each row in its wire form (as
    :func:`~tickwheel.pipeline.events.parse_wire` gives it)."""
    check_positive_int("max_chars", max_chars)
    return _rows(directory, max_chars, on_bytes, parse_wire, to_wire)


def _as_is(row: Event | Quarantined) -> Event | Quarantined:
    return row


def _rows(directory: Path, max_chars: int, on_bytes: Callable[[int], object] | None,
          parse: Callable[[str], R], convert: Callable[[Event | Quarantined], R]
          ) -> Iterator[R]:
    for path in input_files(directory):
        stream = open_input(path)
        if stream is None:
            continue
        with stream:
            if path.suffix == ".parquet":
                for rows in parquet_events(stream):
                    yield from map(convert, rows)
                if on_bytes is not None:
                    on_bytes(os.fstat(stream.fileno()).st_size)
                continue
            # Progress counts the file's own bytes, compressed or not.
            counted: ByteStream = stream if on_bytes is None else _Counted(stream, on_bytes)
            for lines in json_lines(json_stream(counted, path.name), max_chars=max_chars):
                for line in lines:
                    if line.strip():
                        yield parse(line)


class ByteStream(Protocol):
    """What :func:`json_lines` reads: an open binary file, or anything with its
    ``read``."""

    def read(self, size: int, /) -> bytes: ...


class _Counted:
    """A stream that tells ``on_bytes`` how much each read gave."""

    def __init__(self, stream: ByteStream, on_bytes: Callable[[int], object]) -> None:
        self._stream = stream
        self._on_bytes = on_bytes

    def read(self, size: int, /) -> bytes:
        block = self._stream.read(size)
        self._on_bytes(len(block))
        return block


def json_stream(stream: ByteStream, name: str) -> ByteStream:
    """What :func:`json_lines` reads of a JSON Lines file opened as ``stream``: its
    bytes, or, for a name ending ``.gz``, its gzip'd bytes decompressed, a slice at a
    time (a file that expands a thousandfold is never held whole)."""
    return _Gunzipped(stream, name) if name.endswith(GZIP_SUFFIX) else stream


class _Gunzipped:
    """A gzip'd file's bytes, decompressed: its members one after another, zero bytes
    between them skipped (as :mod:`gzip` reads them). Data that cannot be decompressed
    (a file cut short, corrupt, or not gzip at all) ends them with one line naming the
    file and the fault, after the bytes read before it: no JSON, so both engines
    quarantine it as ``unparseable``, as they do a Parquet file that cannot be read.
    An error reading the file itself is raised."""

    _BLOCK = 1 << 20  # compressed bytes read at a time

    def __init__(self, stream: ByteStream, name: str) -> None:
        self._raw = stream
        self._name = name
        self._inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # a gzip member
        self._tail = b""  # compressed bytes read and not yet decompressed
        self._in_member = False  # a byte of the current member was read
        self._given = 0
        self._line_open = False  # the bytes given so far end inside a line
        self._ended = False

    def read(self, size: int, /) -> bytes:
        parts: list[bytes] = []
        wanted = size
        while wanted > 0 and not self._ended:
            try:
                block = self._next(wanted)
            except zlib.error as exc:
                block = self._fault(str(exc))
            parts.append(block)
            wanted -= len(block)
        return b"".join(parts)

    def _next(self, size: int) -> bytes:
        while True:
            if self._inflate.eof:
                rest = self._inflate.unused_data.lstrip(b"\0")
                while not rest:
                    block = self._raw.read(self._BLOCK)
                    if not block:
                        self._ended = True
                        return b""
                    rest = block.lstrip(b"\0")
                self._inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
                self._tail = rest
            data = self._tail or self._raw.read(self._BLOCK)
            if not data:
                if self._in_member:
                    return self._fault("the file ends inside its gzip data (cut short)")
                self._ended = True  # an empty file: no member at all
                return b""
            self._in_member = True
            out = self._inflate.decompress(data, size)
            self._tail = self._inflate.unconsumed_tail
            if out:
                self._given += len(out)
                self._line_open = not out.endswith(b"\n")
                return out

    def _fault(self, why: str) -> bytes:
        self._ended = True
        # On a line of its own: a line the fault cut is a row of its own, as it was.
        line = (("\n" if self._line_open else "")
                + f"unreadable gzip file {self._name} after {self._given} bytes: {why}\n")
        return line.encode("utf-8", "surrogateescape")


_BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark


def json_lines(source: bytes | ByteStream, slice_bytes: int = 8 << 20, *,
               max_chars: int = MAX_ROW_CHARS) -> Iterator[list[str]]:
    r"""The lines of JSON Lines input (a file's bytes, or a binary stream such as an
    open file), as both engines read them: UTF-8 with bad bytes replaced; a byte order
    mark that opens the input left out (RFC 8259 lets a parser ignore it; Windows
    tools write one); ``\n``, ``\r\n`` and ``\r`` all end a line; blank lines
    included; a line longer than
    ``max_chars`` cut to ``max_chars + 1`` characters. They come in lists covering
    about ``slice_bytes`` each: a stream is read that much at a time, and a large file,
    or a long line, is never held or decoded whole."""
    check_positive_int("slice_bytes", slice_bytes)
    check_positive_int("max_chars", max_chars)
    stream = io.BytesIO(source) if isinstance(source, bytes) else source
    # A character takes at most 4 bytes: this many bytes of a line hold more than
    # max_chars characters, and are all of a long line that is kept.
    cap = 4 * (max_chars + 1)
    pending: list[bytes] = []  # the unfinished line, read so far (at most cap bytes)
    held = 0
    dropping = False  # the unfinished line passed cap: the rest of it is not kept
    after_cr = False  # the last block ended with \r: a \n starting this one ends no line
    head = b""  # the input's first bytes, while they may still be a byte order mark
    at_start = True
    while block := stream.read(slice_bytes):
        if at_start:
            head += block
            if len(head) < len(_BOM) and _BOM.startswith(head):
                continue  # a slice shorter than the mark: read on before deciding
            block = head.removeprefix(_BOM)
            at_start = False
            if not block:
                continue
        if after_cr and block.startswith(b"\n"):
            block = block[1:]
        after_cr = block.endswith(b"\r")
        if dropping:
            end = _first_line_end(block)
            if end < 0:
                continue
            block = block[end:]  # from the end of the line cut, whose start is pending
            dropping = False
        # Cut just after a line's end: no UTF-8 sequence spans two slices (a line end
        # is never inside one).
        newline = block.rfind(b"\n")
        cut = max(newline, block.rfind(b"\r", newline + 1)) + 1
        if cut:
            yield _decoded_lines(b"".join([*pending, block[:cut]]) if pending else block[:cut],
                                 max_chars)
            pending, held = [], 0
            block = block[cut:]
        if block:
            pending.append(block)
            held += len(block)
            if held > cap:
                pending, held, dropping = [b"".join(pending)[:cap]], cap, True
    if at_start and head:  # the whole input is shorter than a mark, and starts as one
        pending = [head]
    if pending:
        yield _decoded_lines(b"".join(pending), max_chars)


def _first_line_end(block: bytes) -> int:
    """Where the first line end in ``block`` is; -1 if none."""
    ends = [i for i in (block.find(b"\n"), block.find(b"\r")) if i >= 0]
    return min(ends, default=-1)


def _decoded_lines(content: bytes, max_chars: int) -> list[str]:
    text = str(content, "utf-8", "replace")
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if not lines[-1]:
        lines.pop()  # what follows the last newline
    if len(text) > max_chars and max(map(len, lines), default=0) > max_chars:
        return [line[:max_chars + 1] for line in lines]
    return lines


def parquet_events(source: Path | BinaryIO, batch_rows: int = 65_536
                   ) -> Iterator[list[Event | Quarantined]]:
    """The rows of a Parquet file (a path, or the file opened), ``batch_rows`` at a
    time: a large file is never held whole, only a row group's columns. Rows are
    checked like JSON rows: a null column is a missing field, and the columns' types are
    not coerced (a double ``ts_ms`` is a ``bad_type`` row, not a read error). The raw
    text kept for the quarantine is the row as sorted JSON. A file that is not Parquet
    at all is one ``unparseable`` row whose raw text names the file; one with a row
    group that cannot be read gives the rows of the groups before it, then such a
    row."""
    check_positive_int("batch_rows", batch_rows)
    if isinstance(source, Path):
        with source.open("rb") as stream:
            yield from _parquet_events(stream, source.name, batch_rows)
    else:
        yield from _parquet_events(source, Path(source.name).name, batch_rows)


def _parquet_events(stream: BinaryIO, name: str, batch_rows: int
                    ) -> Iterator[list[Event | Quarantined]]:
    pa, pq = _pyarrow()
    read = 0
    # Read from the open file, not by path: Arrow's messages then name no path, and
    # the raw text is the same whichever path an engine reached the file by.
    try:
        file = pq.ParquetFile(stream)
        schema = file.schema_arrow
        # ParquetFile, not read_table: the dataset layer refuses a repeated column name.
        # A row group at a time, so that the rows kept from a file that cannot be read
        # to its end do not depend on batch_rows.
        for group in range(file.num_row_groups):
            table = file.read_row_group(group, use_threads=False)
            for batch in table.to_batches(max_chunksize=batch_rows):
                yield list(_parquet_rows(pa, schema, batch))
            read += table.num_rows
    except (pa.ArrowException, OSError) as exc:
        after = f" after {read} rows" if read else ""
        yield [Quarantined(f"unreadable Parquet file {name}{after}: {exc}",
                           Reason.UNPARSEABLE, None)]


#: What a Parquet row weighs in a micro-batch's input budget: about a row of the
#: generator's JSON Lines (compressed and encoded, a row takes a few bytes).
PARQUET_ROW_BYTES = 128


def input_bytes(path: Path) -> int:
    """How much input a file holds, as a micro-batch's budget counts it: a JSON Lines
    file's size (a gzip'd one's size decompressed, from its trailer), a Parquet file's
    rows (from its footer) at PARQUET_ROW_BYTES each; 0 for a file gone."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if path.name.endswith(GZIP_SUFFIX):
        return max(size, _gzip_size(path))
    if path.suffix != ".parquet":
        return size
    pa, _ = _pyarrow()
    try:
        with open_parquet(path) as file:
            rows: int = file.metadata.num_rows
    except (pa.ArrowException, OSError):
        return size  # its reader quarantines it
    return max(size, rows * PARQUET_ROW_BYTES)


def _gzip_size(path: Path) -> int:
    """A gzip'd file's size decompressed, as its trailer gives it: modulo 4 GiB, and
    its last member's only (a guess for a budget, never a bound); 0 if unreadable."""
    try:
        with open(path, "rb") as file:
            if file.seek(0, os.SEEK_END) < 18:  # a gzip member's header and trailer
                return 0
            file.seek(-4, os.SEEK_END)
            size: int = struct.unpack("<I", file.read(4))[0]
            return size
    except OSError:
        return 0


def open_input(path: Path) -> BinaryIO | None:
    """An input file opened for reading, or None if it went away after it was listed
    (logged: a service must not stop, or a micro-batch fail for good, because a file
    was moved or deleted; its rows are not applied)."""
    try:
        return path.open("rb")
    except FileNotFoundError:
        log.warning("input file %s went away before it was read: its rows are not "
                    "applied", path)
        return None


def _parquet_rows(arrow: Any, schema: pa.Schema, batch: pa.RecordBatch
                  ) -> Iterator[Event | Quarantined]:
    names = schema.names
    # Arrow maps arrive as (key, value) pairs, and may repeat a key; a schema may
    # repeat a column's name. Either row is read as the JSON object it would be.
    maps = [arrow.types.is_map(field.type) for field in schema]
    repeated_column = len(set(names)) != len(names)
    columns = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
    for values in zip(*columns, strict=True):
        pairs: list[tuple[str, Any]] = []
        repeated = repeated_column
        for column, is_map, cell in zip(names, maps, values, strict=True):
            if cell is None:
                continue
            # A map whose keys are not all strings is no JSON object: left as its
            # pairs, it is a bad type where an object is due (targets).
            value = cell
            if is_map and all(isinstance(key, str) for key, _ in cell):
                value = dict(cell)
                if len(value) != len(cell):
                    repeated = True
                    value = _Pairs(cell)
            pairs.append((column, value))
        if repeated:
            yield parse_line(_object_text(pairs))  # a duplicate_field row
        else:
            clean = dict(pairs)
            yield parse_row(clean, json.dumps(clean, sort_keys=True, default=str))


class _Pairs(list[tuple[str, Any]]):
    """An object's (name, value) pairs in order, names repeated as given."""


def _object_text(pairs: list[tuple[str, Any]]) -> str:
    """JSON text of an object given as pairs, names repeated as given."""
    return "{" + ",".join(
        f"{json.dumps(name)}:"
        f"{_object_text(value) if isinstance(value, _Pairs) else json.dumps(value, default=str)}"
        for name, value in pairs) + "}"


def outcomes_table(rows: list[OutcomeRow]) -> pa.Table:
    """Outcomes in the contract's columns, as both engines write them."""
    pa, _ = _pyarrow()
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
    })


def quarantine_table(rows: list[Quarantined]) -> pa.Table:
    """Quarantined rows in the contract's columns, as both engines write them."""
    pa, _ = _pyarrow()
    return pa.table({
        "raw": pa.array([q.raw for q in rows], pa.string()),
        "reason": pa.array([q.reason.value for q in rows], pa.string()),
        "ts_ms": pa.array([q.ts_ms for q in rows], pa.int64()),
    })


def outcome_rows(table: pa.Table) -> list[OutcomeRow]:
    """The rows of an outcomes table (the contract's columns)."""
    c = table.to_pydict()
    return [OutcomeRow(op_id, _OUTCOMES[outcome], resolved, latency, tuple(keys), error)
            for op_id, outcome, resolved, latency, keys, error in zip(
                c["op_id"], c["outcome"], c["resolved_ms"], c["latency_ms"], c["keys"],
                c["error"], strict=True)]


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
    return 64 + len(row.op_id) + sum(map(len, row.keys)) + len(row.error or "")


def quarantined_size(row: Quarantined) -> int:
    """About the bytes a quarantined row takes (its line is most of it)."""
    return 64 + len(row.raw)


def write_atomically(table: pa.Table, path: Path) -> None:
    """A Parquet file written whole and fsync'd under a hidden name (which no reader
    takes), then renamed into place: a crash, even of the machine, leaves the old file
    or the new one, never half; and a batch's outputs are on disk before the state that
    commits the batch (which is fsync'd after them)."""
    write_tables_atomically(table.schema, [table], path)


def write_tables_atomically(schema: pa.Schema, tables: Iterable[pa.Table], path: Path) -> None:
    """:func:`write_atomically` for tables that come one at a time, each its own row
    group: a merge of files never holds them all."""
    _, pq = _pyarrow()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp")
    try:
        with open(tmp, "wb") as out:
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
    a run's outputs need not fit in memory. The file is written under a hidden name
    (``tmp_name``; by default the name's stem after a dot, which no reader takes), then
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
                 tmp_name: str | None = None) -> None:
        _, pq = _pyarrow()
        self.path = directory / name
        self.rows = 0
        self._to_table = to_table
        self._group_rows = check_positive_int("group_rows", group_rows)
        self._row_bytes = row_bytes
        self._group_bytes = check_positive_int("group_bytes", group_bytes)
        self._pending: list[R] = []
        self._pending_bytes = 0
        directory.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(tmp_name or f".{self.path.stem}.tmp")
        self._file = open(self._tmp, "wb")  # noqa: SIM115 - closed by close() or abort()
        try:
            self._writer = pq.ParquetWriter(self._file, to_table([]).schema)
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
    pa, _ = _pyarrow()
    with open_parquet(path) as file:
        for batch in file.iter_batches(batch_rows, columns=list(_OUTCOME_COLUMNS),
                                       use_threads=False):
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
    pa, _ = _pyarrow()
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
    _pyarrow()
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


def _output_tables(directory: Path, columns: Sequence[str]) -> Iterator[tuple[Path, pa.Table]]:
    pa, _ = _pyarrow()
    if not directory.is_dir():
        return
    paths = sorted(directory.iterdir())
    covered = _merged_away(paths)
    for path in paths:
        if path.name.startswith(".") or path in covered:
            continue  # a write in progress; rows a merged file holds too
        if not _OUTPUT_FILE.fullmatch(path.name):
            raise OutputDirError(f"{path} was not written by tickwheel")
        try:
            with open_parquet(path) as file:
                names = file.schema_arrow.names
                missing = [c for c in columns if c not in names]
                if missing:
                    raise OutputDirError(f"{path} lacks the columns {', '.join(missing)}")
                table = file.read(columns=list(columns), use_threads=False)
        except FileNotFoundError:
            raise _Vanished(path) from None
        except (pa.ArrowException, OSError) as exc:
            raise OutputDirError(f"{path} cannot be read as the Parquet file tickwheel "
                                 f"wrote there: {exc}") from None
        yield path, table


def checkpoint_id(checkpoint: Path) -> str | None:
    """The id of a Spark engine's checkpoint (None for a new one)."""
    try:
        return str(json.loads((checkpoint / "tickwheel.json").read_text())["id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def output_owner(output: Path) -> str | None:
    """The id of the Spark checkpoint whose outputs ``output`` holds, if any."""
    try:
        return str(json.loads((output / OWNER_FILE).read_text())["checkpoint"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


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
        for name in (*OUTPUT_SUBDIRS, OWNER_FILE, REPORT_FILE):
            target = output / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
        if checkpoint is not None and checkpoint.exists():
            if not inside:
                raise OutputDirError(
                    f"--overwrite starts afresh, but the checkpoint {checkpoint} is not "
                    f"inside {output}: delete it or give a new one")
            shutil.rmtree(checkpoint)
        return
    if not output.is_dir():
        return
    ours = set(OUTPUT_SUBDIRS)
    if checkpoint is not None:
        ours |= {OWNER_FILE, f".{OWNER_FILE}.tmp", REPORT_FILE, DEFAULT_CHECKPOINT}
        if inside:
            ours.add(checkpoint.relative_to(output).parts[0])
    strangers = sorted(p.name for p in output.iterdir() if p.name not in ours)
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

