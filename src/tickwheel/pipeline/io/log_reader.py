"""An input file's rows, as both engines read them: JSON Lines (gzip'd or not) in
slices, Parquet a row group at a time; and what a file weighs in a micro-batch's
budget. Parquet needs ``pyarrow`` (``pip install 'tickwheel[cli]'``)."""

from __future__ import annotations

import io
import json
import logging
import os
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, TypeVar

from tickwheel._validate import check_positive_int
from tickwheel.pipeline.contract.events import (
    MAX_ROW_CHARS,
    Event,
    Quarantined,
    Reason,
    Wire,
    parse_line,
    parse_row,
    parse_wire,
    to_wire,
)
from tickwheel.pipeline.io._arrow import open_parquet, pyarrow_modules
from tickwheel.pipeline.io.input_dir import GZIP_SUFFIX, input_files

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["PARQUET_ROW_BYTES", "ByteStream", "input_bytes", "json_lines", "json_stream",
           "open_input", "parquet_events", "read_events", "read_wire"]

log = logging.getLogger(__name__)
R = TypeVar("R")


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
    :func:`~tickwheel.pipeline.contract.events.parse_wire` gives it)."""
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
    pa, pq = pyarrow_modules()
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
    pa, _ = pyarrow_modules()
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
