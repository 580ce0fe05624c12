"""IntakeFeed: what an intake in the same process shares with a following engine.

An intake (such as :class:`~tickwheel.service.server.SubmitServer`) writes rows into
the engine's input directory; the engine lists and reads them. Three things pass
between them besides the files, and all three live here, made before either of them:

- **the time floor**: rows without ``ts_ms`` are stamped by the intake (:meth:`stamp`),
  never below a stamp handed out before. :meth:`time_floor` is the earliest ``ts_ms``
  a row not yet in the input directory can carry; an engine whose clock reads at most
  ``time_floor() + lateness_ms`` never counts such a row late, however long its commit
  or the engine's batch takes. With ``floor_file``, the intake also writes the floor
  there, for an engine whose reader runs in another process (Spark's source);
- **offered rows**: the rows of each file the intake landed, as it parsed them
  (:meth:`offer`); a batch takes them (:meth:`take`) rather than parse the file again,
  unless the file changed since;
- **giving way**: the intake notes each request (:meth:`arrived`); between two pieces
  of a batch the engine calls :meth:`give_way`, which sleeps a moment while requests
  come, so that the intake's thread takes the interpreter's lock and answers them
  rather than wait a switch interval after each of its system calls.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tickwheel.pipeline.contract.events import Wire

__all__ = [
    "BUSY_FOR_S",
    "GIVE_WAY_S",
    "MAX_OFFERED_ROWS",
    "FileStat",
    "IntakeFeed",
    "TimeStamper",
]

#: How long an engine's thread sleeps in :meth:`IntakeFeed.give_way`.
GIVE_WAY_S: Final = 0.0005
#: The intake counts as busy for this long after a request arrives.
BUSY_FOR_S: Final = 1.0
#: Rows the feed holds offered and not yet taken, at most: past that, files are
#: parsed from disk as they are read.
MAX_OFFERED_ROWS: Final = 200_000


@dataclass(frozen=True, slots=True)
class FileStat:
    """An input file's size and modification time (ns), as its writer or reader saw
    them: rows offered for it are taken only while the file has both."""

    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> FileStat | None:
        """The file's stat now, or None if it cannot be read."""
        try:
            stat = path.stat()
        except OSError:
            return None
        return cls(stat.st_size, stat.st_mtime_ns)


class TimeStamper:
    """The intake's time for rows that carry none: the clock, but never below a time
    already handed out, so that a stamped row is never behind an earlier one.

    It also keeps the *floor*: the earliest time a row not yet in the input directory
    can carry (a stamp is held from :meth:`stamp` until :meth:`settle`)."""

    def __init__(self, clock: Callable[[], int], last_ms: int = 0) -> None:
        self.clock = clock
        self._last = last_ms  # a time handed out before a restart, if known
        self._held: Counter[int] = Counter()  # stamps of rows not yet landed or refused
        self._lock = threading.Lock()

    def keep_above(self, ms: int) -> None:
        """Hand out no stamp below ``ms`` from now on (a time stamped before a
        restart, or an engine's time at its start)."""
        with self._lock:
            self._last = max(self._last, ms)

    def stamp(self) -> int:
        """A time for a request's rows, held in the floor until :meth:`settle`."""
        with self._lock:
            self._last = max(self._last, self.clock())
            self._held[self._last] += 1
            return self._last

    def settle(self, stamp: int) -> None:
        """Let go of ``stamp``: its rows are in the input directory, or refused."""
        with self._lock:
            left = self._held[stamp] - 1
            assert left >= 0, f"stamp {stamp} settled more often than handed out"
            if left:
                self._held[stamp] = left
            else:
                del self._held[stamp]

    def held(self) -> int:
        """How many requests' stamps are held: stamped, and not yet landed or refused."""
        with self._lock:
            return self._held.total()

    def floor(self) -> int:
        """No row that is not in the input directory yet carries a stamp below this:
        the oldest stamp held, or else the least time the next stamp can be."""
        with self._lock:
            if self._held:
                return min(self._held)
            # Kept as handed out: a stamp after a clock stepped back is not below it.
            self._last = max(self._last, self.clock())
            return self._last


class IntakeFeed:
    """The intake's side of a following engine in the same process: made first, and
    given to both (``feed=``). ``clock`` stamps rows (epoch ms); ``floor_file`` is
    where the intake writes the floor for a reader in another process;
    ``give_way_s`` is how long :meth:`give_way` sleeps (0: never)."""

    def __init__(self, clock: Callable[[], int], *, floor_file: Path | None = None,
                 give_way_s: float = GIVE_WAY_S,
                 max_offered_rows: int = MAX_OFFERED_ROWS) -> None:
        if not 0 <= give_way_s <= 1:  # also refuses NaN
            raise ValueError(f"give_way_s must be from 0 to 1 (seconds), not {give_way_s!r}")
        if max_offered_rows < 0:
            raise ValueError(f"max_offered_rows must be at least 0, not {max_offered_rows}")
        self.stamper = TimeStamper(clock)
        self.floor_file = floor_file
        self.give_way_s = give_way_s
        self.max_offered_rows = max_offered_rows
        self._last_request = -math.inf  # time.perf_counter() of the latest request
        self._offered: dict[str, tuple[FileStat, list[Wire]]] = {}
        self._offered_rows = 0
        self._taken_upto = ""  # the last input file name taken: an offer of it is late
        self._lock = threading.Lock()

    @property
    def clock(self) -> Callable[[], int]:
        return self.stamper.clock

    def time_floor(self) -> int:
        """The earliest ``ts_ms`` that a row acknowledged from now on, or being
        written, can carry where the intake stamped it."""
        return self.stamper.floor()

    # -- offered rows -----------------------------------------------------------------

    def offer(self, name: str, rows: list[Wire], stat: FileStat) -> None:
        """The rows of input file ``name`` as the intake wrote and parsed them (its
        stat then). Rows past ``max_offered_rows`` not yet taken are not kept."""
        with self._lock:
            # Batches read files in name order, and an intake lands them in name order:
            # rows of a file at or before the last one taken would never be taken.
            if (name <= self._taken_upto or name in self._offered
                    or self._offered_rows + len(rows) > self.max_offered_rows):
                return
            self._offered[name] = (stat, rows)
            self._offered_rows += len(rows)

    def take(self, name: str, stat: FileStat | None) -> list[Wire] | None:
        """The rows offered for ``name`` if the file still has ``stat``, else None
        (read the file); offers of files up to ``name`` are let go either way."""
        with self._lock:
            self._taken_upto = max(self._taken_upto, name)
            offered = self._offered.pop(name, None)
            if offered is not None:
                self._offered_rows -= len(offered[1])
        if offered is not None and offered[0] == stat:
            return offered[1]
        return None

    @property
    def offered_rows(self) -> int:
        """Rows offered and not yet taken."""
        return self._offered_rows

    # -- giving way -------------------------------------------------------------------

    def arrived(self) -> None:
        """A request arrived: the intake is busy for :data:`BUSY_FOR_S` from now."""
        self._last_request = time.perf_counter()

    def busy(self) -> bool:
        """Whether a request arrived within the last :data:`BUSY_FOR_S`."""
        return time.perf_counter() - self._last_request <= BUSY_FOR_S

    def give_way(self) -> bool:
        """For the engine's thread, between two pieces of a batch: while the intake is
        busy, sleep ``give_way_s``. Returns whether it slept."""
        if not self.give_way_s or not self.busy():
            return False
        time.sleep(self.give_way_s)
        return True
