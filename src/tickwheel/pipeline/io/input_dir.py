"""The input directory: which of its files are input, listed in name order as both
engines list them, and what is refused or skipped, said once.

Input files are ``*.jsonl``, ``*.json`` (either gzip'd as ``*.jsonl.gz``, ``*.json.gz``)
and ``*.parquet``; names starting with ``.`` or ``_`` are not input (a file being
written is renamed into place from a hidden name).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tickwheel.pipeline.contract.events import is_utf8

__all__ = ["GZIP_SUFFIX", "HADOOP_GLOB_CHARS", "INPUT_NAMES", "SUFFIXES", "InputError",
           "check_spark_paths", "input_dir_problem", "input_files", "input_names",
           "is_input_name",
           "is_plain_name", "same_input", "within"]

log = logging.getLogger(__name__)

SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".parquet")
GZIP_SUFFIX = ".gz"
#: The input files' names, as messages give them.
INPUT_NAMES = "files named *.jsonl or *.json (gzip'd or not) or *.parquet"
_COMPRESSED = (".bz2", ".xz", ".zst", ".zstd", ".lz4", ".zip", ".snappy", ".br")


#: Characters Hadoop takes as a glob pattern in a path, both where Spark's file source
#: lists a directory and where it reads each file listed. The Spark engine lists the
#: input itself (see ``spark._input_log``); only its checkpoint, where its sources
#: list tickwheel's own files, must be free of them.
HADOOP_GLOB_CHARS = frozenset("{}[]*?\\")


class InputError(ValueError):
    """An input the engines cannot read the same way (refused before any work)."""



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
    return [directory / name for name in input_names(directory, skipped=skipped, warn=warn)]


def input_names(directory: Path, *, skipped: dict[str, str] | None = None,
                warn: bool = True) -> list[str]:
    """:func:`input_files`' names. A service lists its input every batch: one
    ``scandir`` pass, whose entries know their type without a ``stat`` per file, and
    names sorted as strings, keep a listing of 50,000 files to milliseconds."""
    problem = input_dir_problem(directory)
    if problem is not None:
        raise FileNotFoundError(problem)
    root: Path | None = None  # resolved once, for the first symlink
    names = []
    skipping: dict[str, str] = {}
    with os.scandir(directory) as scan:
        entries = sorted(scan, key=lambda entry: entry.name)
    for entry in entries:
        name = entry.name
        if not is_input_name(name):
            # A hidden name is a file on its way in; any other file is said to be
            # left unread, so that a log kept as .csv or .jsonl.gz is not lost silently.
            if not name.startswith((".", "_")) and entry.is_file():
                _skip(directory / name, _unread_reason(name), skipped, skipping, warn)
            continue
        if entry.is_file(follow_symlinks=False) and is_utf8(name):
            names.append(name)  # the common case, with no Path made
            continue
        path = directory / name
        if not is_utf8(name):  # undecodable bytes come as lone surrogates
            if skipped is None:
                raise InputError(f"input file name {name!r} in {directory} is not valid "
                                 "UTF-8: rename it")
            _skip(path, "its name is not valid UTF-8: rename it", skipped, skipping, warn)
            continue
        if entry.is_symlink():
            try:
                target = path.resolve(strict=True)
            except (OSError, RuntimeError):  # RuntimeError: a loop, before Python 3.13
                _skip(path, "a symlink that leads to no file", skipped, skipping, warn)
                continue
            root = directory.resolve() if root is None else root
            if not within(target, root):
                _skip(path, f"a symlink to {str(target)!r}, outside the input directory", skipped,
                      skipping, warn)
                continue
        if not entry.is_file():
            # Spark writes a "file" as a directory of parts: say they are not read.
            _skip(path, "a directory, not a file: files in it are not read" if entry.is_dir()
                  else "not a regular file (a pipe, socket or device)", skipped, skipping,
                  warn)
            continue
        names.append(name)
    if skipped is not None:
        skipped.clear()
        skipped.update(skipping)
    return names


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


def is_plain_name(name: str) -> bool:
    """Whether ``name`` names a file directly inside a directory: not empty, ``.`` or
    ``..``, and holding no separator or NUL (what a checkpoint may name)."""
    return (bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name
            and (os.altsep is None or os.altsep not in name))


def same_input(saved: str | None, input_dir: Path, checkpoint: Path) -> None:
    """Refuse a checkpoint made for another input directory than ``input_dir`` (compared
    resolved: ``in/../in`` and a symlink to ``in`` are ``in``)."""
    here = str(input_dir.resolve())
    if saved is not None and saved != here:
        raise ValueError(f"the checkpoint {checkpoint} reads the input {saved}, not {here}: "
                         "give the same --input, or another checkpoint")


def within(path: Path, directory: Path) -> bool:
    """Whether ``path`` is ``directory`` or under it (both resolved by the caller)."""
    return path == directory or directory in path.parents
