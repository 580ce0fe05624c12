"""Files written whole: an exclusive temporary beside the target, synced, then renamed.

The temporary name is ``.<target name>.<8 hex digits>.tmp``, created with ``O_EXCL`` and
``O_NOFOLLOW``: a file or a symlink planted at a guessable name makes the creation fail
and a fresh name is drawn, so a write never goes through someone else's link. The mode is
the umask's, as for any file the user writes. Readers skip names that start with a dot.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
from pathlib import Path
from typing import BinaryIO

__all__ = ["append_synced", "fsync_directory", "is_temporary_of", "open_temporary",
           "read_bytes_nofollow", "truncate_nofollow", "write_bytes_atomically"]

_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
          | getattr(os, "O_CLOEXEC", 0))
_SUFFIX = re.compile(r"[0-9a-f]{8}\.tmp")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
#: Each write syncs its data as ``fdatasync`` does before it returns: a write and its
#: sync give up the interpreter's lock once, not twice (each time, a thread that gives
#: it up may wait the switch interval to win it back from a busy one).
_DSYNC = getattr(os, "O_DSYNC", 0)


def _open_nofollow(path: Path, flags: int) -> int:
    """A descriptor of ``path`` itself; ValueError if it is a symbolic link (a
    checkpoint's files are read and written only inside it, whatever is planted there)."""
    try:
        return os.open(path, flags | _NOFOLLOW, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"{path} is a symbolic link, which tickwheel does not "
                             "follow out of its own directories") from None
        raise


def read_bytes_nofollow(path: Path) -> bytes:
    """The file's bytes (FileNotFoundError if there is none, ValueError if it is a
    symbolic link)."""
    with os.fdopen(_open_nofollow(path, os.O_RDONLY), "rb") as file:
        return file.read()


def append_synced(path: Path, data: bytes) -> None:
    """``data`` appended to ``path`` (created if missing, never through a symbolic
    link) and fsync'd."""
    fd = _open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def truncate_nofollow(path: Path, size: int) -> None:
    """``path`` cut to ``size`` bytes, and fsync'd."""
    fd = _open_nofollow(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def open_temporary(path: Path, prefix: str | None = None) -> tuple[BinaryIO, Path]:
    """A new, empty file beside ``path`` under a hidden name of its own (``prefix``, by
    default ``.<name>.``, then 8 random hex digits and ``.tmp``), open for writing."""
    fd, tmp = _create_temporary(path, prefix, 0)
    return os.fdopen(fd, "wb"), tmp


def _create_temporary(path: Path, prefix: str | None, flags: int) -> tuple[int, Path]:
    head = f".{path.name}." if prefix is None else prefix
    for _ in range(64):
        tmp = path.with_name(f"{head}{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, _FLAGS | flags, 0o666), tmp
        except FileExistsError:
            continue  # taken, or planted: draw another name
    raise FileExistsError(f"no free temporary name beside {path}")


def is_temporary_of(name: str, prefix: str) -> bool:
    """Whether ``name`` is a temporary file that :func:`open_temporary` made with
    ``prefix``."""
    return name.startswith(prefix) and _SUFFIX.fullmatch(name, len(prefix)) is not None


def write_bytes_atomically(data: bytes, path: Path, *, sync: bool = True) -> None:
    """``data`` written whole and synced under a hidden name (which no reader takes),
    then renamed into place: a crash leaves the old file or the new one, never half.
    Without ``sync``, a reader still sees one whole file, but a crash of the machine
    may leave the old one (for what is written again at every start)."""
    fd, tmp = _create_temporary(path, None, _DSYNC if sync else 0)
    try:
        try:
            _write_all(fd, data)
            if sync and not _DSYNC:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def fsync_directory(directory: Path) -> None:
    """The directory's entries on disk: a rename into it survives a crash of the
    machine only once this returns."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

