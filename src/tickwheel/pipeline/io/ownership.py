"""One owner per checkpoint (and per output directory): a lock held for a run's life.

The lock is ``flock`` on a file in the directory, taken without waiting. The kernel drops
it when its holder dies, ``kill -9`` included, so a crashed owner never blocks its
successor. The file names the holder (host, pid, since when) for the refusal's message,
and counts an epoch, one more for each owner: an owner checks before each batch that
the file at the path is still the one it locked, with its epoch, and stops otherwise
(the directory was replaced, or the lock file removed and taken by another).

The owner is the process: taking a lock the process already holds returns the same lock,
counted, so an engine and the command that built it may both take it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LOCK_FILE", "Holder", "OwnerLock", "OwnershipError", "OwnershipLost", "RunOwner",
           "hold_run_directories"]

log = logging.getLogger(__name__)

#: The lock file's name, in each directory a run owns.
LOCK_FILE = "_tickwheel.lock"

_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class OwnershipError(RuntimeError):
    """Another process holds the directory, or its lock file cannot be taken."""


class OwnershipLost(OwnershipError):
    """The lock file this run holds is no longer the one at its path."""


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a directory: written into the lock file by its owner."""

    host: str
    pid: int
    since_ms: int
    epoch: int

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since_ms / 1000))
        return f"pid {self.pid} on {self.host} (since {since}, epoch {self.epoch})"


def _read_holder(fd: int) -> Holder | None:
    try:
        data = os.pread(fd, 4096, 0)
        fields = json.loads(data.decode("utf-8"))
        return Holder(str(fields["host"]), int(fields["pid"]), int(fields["since_ms"]),
                      int(fields["epoch"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class _Held:
    def __init__(self, path: Path, fd: int, holder: Holder) -> None:
        self.path = path
        self.fd = fd
        self.holder = holder
        self.count = 0
        stat = os.fstat(fd)
        self.identity = (stat.st_dev, stat.st_ino)


_held: dict[tuple[int, int], _Held] = {}
_held_lock = threading.Lock()


class OwnerLock:
    """This process's hold on ``directory`` (created if missing); ``what`` names it in
    messages ("checkpoint", "output"). Raises :class:`OwnershipError` naming the holder
    when another process has it."""

    def __init__(self, directory: Path, what: str) -> None:
        if directory.exists() and not directory.is_dir():
            raise OwnershipError(f"{what} {directory} exists and is not a directory")
        self.created = not directory.exists()  # abandon() takes it away again
        directory.mkdir(parents=True, exist_ok=True)
        self.what = what
        self.path = directory / LOCK_FILE
        stat = directory.stat()
        key = (stat.st_dev, stat.st_ino)
        with _held_lock:
            held = _held.get(key)
            if held is None:
                held = _held[key] = self._take()
            held.count += 1
        self._key = key
        self._held: _Held | None = held

    def _take(self) -> _Held:
        try:
            fd = os.open(self.path, _FLAGS, 0o644)
        except OSError as exc:
            raise OwnershipError(f"the {self.what} lock {self.path} cannot be opened "
                                 f"({exc.strerror}): remove it if it is not a file") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            who = "another process" if holder is None else holder.describe()
            raise OwnershipError(f"the {self.what} {self.path.parent} is in use by {who}: "
                                 "stop it first, or give another directory") from None
        except OSError:
            os.close(fd)
            raise
        previous = _read_holder(fd)
        holder = Holder(socket.gethostname(), os.getpid(), time.time_ns() // 1_000_000,
                        (previous.epoch if previous is not None else 0) + 1)
        data = json.dumps({"host": holder.host, "pid": holder.pid,
                           "since_ms": holder.since_ms, "epoch": holder.epoch}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)
        return _Held(self.path, fd, holder)

    @property
    def holder(self) -> Holder:
        assert self._held is not None, "released"
        return self._held.holder

    @property
    def epoch(self) -> int:
        return self.holder.epoch

    def check(self) -> None:
        """Raise :class:`OwnershipLost` unless the lock file at the path is still the
        one this process holds, with its epoch."""
        held = self._held
        if held is None:
            raise OwnershipLost(f"the {self.what} lock {self.path} was released")
        try:
            stat = os.stat(self.path, follow_symlinks=False)
        except OSError:
            stat = None
        if stat is None or (stat.st_dev, stat.st_ino) != held.identity:
            raise OwnershipLost(f"the {self.what} {self.path.parent} was replaced or its lock "
                                "file removed while this run held it: stopping before the "
                                "next batch")
        on_disk = _read_holder(held.fd)
        if on_disk is None or on_disk.epoch != held.holder.epoch:
            raise OwnershipLost(f"the {self.what} lock {self.path} names another owner "
                                f"({'nobody' if on_disk is None else on_disk.describe()}): "
                                "stopping before the next batch")

    def release(self) -> None:
        """Give up this hold; the lock goes when the process's last hold does."""
        held, self._held = self._held, None
        if held is None:
            return
        with _held_lock:
            held.count -= 1
            if held.count == 0:
                del _held[self._key]
                os.close(held.fd)

    def abandon(self) -> None:
        """Release, and remove the directory if this hold created it and it holds
        nothing but the lock file: a run refused at start leaves nothing behind."""
        self.release()
        with _held_lock:
            still_held = self._key in _held  # another hold of this process has it
        if self.created and not still_held:
            try:
                self.path.unlink(missing_ok=True)
                self.path.parent.rmdir()
            except OSError:
                pass  # something else is in it now: it stays

    def __enter__(self) -> OwnerLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class RunOwner:
    """A run's holds: its checkpoint (if it has one) and its output directory."""

    def __init__(self, locks: list[OwnerLock]) -> None:
        self.locks = locks

    @property
    def epoch(self) -> int:
        """The first lock's epoch (the checkpoint's, when there is one)."""
        return self.locks[0].epoch

    def check(self) -> None:
        for lock in self.locks:
            lock.check()

    def release(self) -> None:
        for lock in reversed(self.locks):
            lock.release()

    def abandon(self) -> None:
        """Release, removing what taking the holds created (see OwnerLock.abandon)."""
        for lock in reversed(self.locks):
            lock.abandon()


def hold_run_directories(output: Path, checkpoint: Path | None) -> RunOwner:
    """Take the checkpoint (if any), then the output directory, or raise
    :class:`OwnershipError` naming whoever holds one, holding neither."""
    locks: list[OwnerLock] = []
    try:
        if checkpoint is not None:
            locks.append(OwnerLock(checkpoint, "checkpoint"))
        locks.append(OwnerLock(output, "output"))
    except BaseException:
        for lock in reversed(locks):
            lock.abandon()
        raise
    return RunOwner(locks)
