"""Schedule: when a recurring job fires, as a pure function of time.

One type for every user of recurring work: the timers' ``schedule_recurring``, the
asyncio integration and the pipeline's ``schedule`` rows. Times are Unix epoch
milliseconds (wall time, UTC); a cron schedule reads its fields in its ``tz``.

Worked example, ``Schedule(cron="30 2 * * *", tz="America/New_York")``: on 2026-03-08
the clocks jump from 02:00 to 03:00, so 02:30 does not exist and the day's occurrence
is the first instant after the gap, 03:00 EDT (07:00 UTC). On 2026-11-01 01:30 comes
twice; a schedule at 01:30 fires at the first, 01:30 EDT (05:30 UTC), and not at the
second, while a frequent one (``*/15 * * * *``: its minute or hour field starts with
``*``) fires in both passes, as cron runs such jobs. An interval schedule counts exact
milliseconds from its anchor and ignores zones.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from enum import StrEnum
from typing import Any

from tickwheel.schedules._cron import CronExpression
from tickwheel.schedules._zone import instant_ms, load_zone, local_of, repeated_window, wall_ms

__all__ = ["Catchup", "Misfire", "Schedule", "ScheduleError"]

#: Datetime's range: cron searches end at year 10000 (and intervals are bounded too, so
#: every occurrence can be shown as a date).
MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
MIN_MS = -62_135_596_800_000  # 0001-01-01T00:00:00Z
DAY_MS = 86_400_000


class ScheduleError(ValueError):
    """A schedule that is malformed or can never fire; the message names the field."""


class Misfire(StrEnum):
    """What happens to occurrences noticed more than ``grace_ms`` after their time
    (an outage, a clock that stepped forward, a gap in a log)."""

    #: Fire once, for the latest missed occurrence (unless one on time follows it).
    LATEST = "latest"
    #: Fire every missed occurrence no older than ``catchup_ms``.
    ALL = "all"
    #: Fire none of them; go on with the next one on time.
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Catchup:
    """What :meth:`Schedule.plan` decided for the occurrences in (after_ms, now_ms]."""

    #: Occurrences to fire now, oldest first.
    fire: tuple[int, ...]
    #: Occurrences passed over by the misfire policy.
    skipped: int
    #: The last occurrence decided; the next plan starts after it.
    after_ms: int
    #: True when the budget ran out before now_ms: plan again from ``after_ms``.
    more: bool
    #: True when the series is over (``end_ms`` passed, or ``max_runs`` reached).
    finished: bool
    #: Occurrences computed one by one (fired or skipped): the plan's cost. An
    #: interval's skipped occurrences are counted at once, not looked at.
    looked: int = 0


_FIELD_NAMES = ("every_ms", "anchor_ms", "cron", "tz", "start_ms", "end_ms", "max_runs",
                "jitter_ms", "misfire", "grace_ms", "catchup_ms")


_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1_000))


def _duration(ms: int) -> str:
    """The largest unit that divides ``ms`` exactly: 5400000 is ``90 min``."""
    for name, size in _UNITS:
        if ms % size == 0:
            return f"{ms // size:,} {name}"
    return f"{ms:,} ms"


def _utc(ms: int) -> str:
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, ValueError, OSError):  # beyond datetime's years
        return f"{ms:,} ms"


@functools.lru_cache(maxsize=4_096)
def _parse_cron(text: str) -> CronExpression:
    """Parsed expressions are immutable: schedules of one spec share one."""
    return CronExpression.parse(text)


def _int_field(name: str, value: object, low: int, high: int = MAX_MS) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScheduleError(f"{name} must be an int number of milliseconds, got {value!r}")
    if not low <= value <= high:
        raise ScheduleError(f"{name} must be in [{low}, {high}], got {value}")
    return int(value)


@dataclass(frozen=True, slots=True)
class Schedule:
    """A recurring schedule: an interval (``every_ms`` from ``anchor_ms``) or a cron
    expression in an IANA zone (``cron``, ``tz``), with optional bounds, jitter and a
    misfire policy. Construction refuses a malformed field, naming it, and a schedule
    that can never fire."""

    every_ms: int | None = None
    anchor_ms: int = 0
    cron: str | None = None
    tz: str = "UTC"
    #: Occurrences before ``start_ms`` or after ``end_ms`` (both inclusive) do not exist.
    start_ms: int | None = None
    end_ms: int | None = None
    #: The series ends after this many fires (skipped occurrences do not count).
    max_runs: int | None = None
    #: Each occurrence fires up to this much later, by a hash of (schedule id, time).
    jitter_ms: int = 0
    misfire: Misfire = Misfire.LATEST
    #: How late an occurrence may be noticed and still count as on time.
    grace_ms: int = 60_000
    #: How far back ``misfire="all"`` fires missed occurrences.
    catchup_ms: int = DAY_MS
    _cron: CronExpression | None = field(default=None, init=False, repr=False, compare=False)
    _zone: tzinfo | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.every_ms is None) == (self.cron is None):
            raise ScheduleError("give exactly one of every_ms (an interval) or cron")
        if self.every_ms is not None:
            _int_field("every_ms", self.every_ms, 1, MAX_MS)
            _int_field("anchor_ms", self.anchor_ms, MIN_MS)
            if self.tz != "UTC":
                raise ScheduleError("tz applies to cron schedules only: an interval is "
                                    "an exact duration in any zone")
        else:
            if not isinstance(self.cron, str):
                raise ScheduleError(f"cron must be a string, got {type(self.cron).__name__}")
            try:
                expr = _parse_cron(self.cron)
            except (ValueError, TypeError) as exc:
                raise ScheduleError(str(exc)) from None
            object.__setattr__(self, "_cron", expr)
            try:
                zone = load_zone(self.tz)
            except ValueError as exc:
                raise ScheduleError(str(exc)) from None
            object.__setattr__(self, "_zone", zone)
        for name in ("start_ms", "end_ms"):
            value = getattr(self, name)
            if value is not None:
                _int_field(name, value, MIN_MS)
        if self.max_runs is not None and (isinstance(self.max_runs, bool) or not isinstance(
                self.max_runs, int) or self.max_runs < 1):
            raise ScheduleError(f"max_runs must be an int >= 1, got {self.max_runs!r}")
        _int_field("jitter_ms", self.jitter_ms, 0, DAY_MS)
        if self.every_ms is not None and self.jitter_ms > self.every_ms:
            raise ScheduleError(f"jitter_ms ({self.jitter_ms}) must not exceed every_ms "
                                f"({self.every_ms}): occurrences would fire out of order")
        try:
            object.__setattr__(self, "misfire", Misfire(self.misfire))
        except ValueError:
            raise ScheduleError(f"misfire must be one of latest, all, skip; got "
                                f"{self.misfire!r}") from None
        _int_field("grace_ms", self.grace_ms, 0)
        _int_field("catchup_ms", self.catchup_ms, 0)
        if self.start_ms is not None and self.end_ms is not None \
                and self.end_ms < self.start_ms:
            raise ScheduleError(f"end_ms ({self.end_ms}) is before start_ms ({self.start_ms})")
        first = self.next_after(MIN_MS - 1 if self.start_ms is None else self.start_ms - 1)
        if first is None:
            raise ScheduleError(f"schedule {self.describe()} can never fire between its "
                                f"start_ms and end_ms")

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Schedule:
        """A schedule from a mapping of its fields (a log row, a JSON body); an unknown
        field is refused by name."""
        unknown = sorted(set(fields) - set(_FIELD_NAMES))
        if unknown:
            raise ScheduleError(f"unknown schedule field {unknown[0]!r}")
        if fields.get("every_ms") is not None and fields.get("tz") is not None:
            # Refused when given at all, "UTC" too: one rule, not one per value.
            raise ScheduleError("tz applies to cron schedules only: an interval is an "
                                "exact duration in any zone")
        return cls(**{k: v for k, v in fields.items() if v is not None})

    def to_fields(self) -> dict[str, Any]:
        """The fields :meth:`from_fields` takes back, those not at their defaults, as
        JSON values: a ``schedule`` row's spec."""
        fields: dict[str, Any] = {}
        for name in _FIELD_NAMES:
            value = getattr(self, name)
            if value != _DEFAULTS[name]:
                fields[name] = value.value if isinstance(value, Misfire) else value
        return fields

    # -- occurrences ------------------------------------------------------------------

    def next_after(self, t_ms: int) -> int | None:
        """The first occurrence strictly after ``t_ms`` within the bounds, or None."""
        if self.start_ms is not None and t_ms < self.start_ms:
            t_ms = self.start_ms - 1
        if t_ms >= MAX_MS:
            return None
        every = self.every_ms
        nxt: int | None
        if every is not None:
            anchor = self.anchor_ms
            nxt = anchor + ((t_ms - anchor) // every + 1) * every
        else:
            nxt = self._next_cron(t_ms)
            if nxt is None:
                return None
        if nxt > MAX_MS or (self.end_ms is not None and nxt > self.end_ms):
            return None
        return nxt

    def _next_cron(self, t_ms: int) -> int | None:
        expr, zone = self._cron, self._zone
        assert expr is not None and zone is not None
        t_ms = max(t_ms, MIN_MS + 2 * DAY_MS)  # room for any zone's offset
        # In the second pass of a repeated hour, the repeated wall times map to the
        # first pass, before t: the search starts at the end of the repeated range.
        local = local_of(t_ms, zone)
        window = (repeated_window(t_ms, zone, local) if local.fold or expr.every_pass
                  else None)
        if local.fold:
            assert window is not None, "a second pass outside a repeated hour"
            transition, before, _ = window
            local = local_of(transition + before - 1, UTC)
        first: int | None = None
        while True:
            candidate = expr.next_local(local)
            if candidate is None:
                break
            at = instant_ms(candidate, zone)
            if at > t_ms:
                first = at
                break
            local = candidate
        if window is None or not expr.every_pass:
            return first
        second = self._next_in_second_pass(t_ms, window)
        if second is None or (first is not None and first <= second):
            return first
        return second

    def _next_in_second_pass(self, t_ms: int, window: tuple[int, int, int]) -> int | None:
        """For a frequent spec, the first occurrence after ``t_ms`` in the second pass
        of the repeated hour ``window`` that ``t_ms`` is in (either pass of it), or
        None. The first pass is the ordinary search's; a later repeated hour's second
        pass never comes before its first."""
        expr = self._cron
        assert expr is not None
        transition, before, after = window
        # Wall times read with the offset after: from the second pass's start on.
        start = local_of(max(t_ms, transition - 1) + after, UTC)
        candidate = expr.next_local(start)
        if candidate is None or wall_ms(candidate) >= transition + before:
            return None
        return wall_ms(candidate) - after

    def jitter_for(self, schedule_id: str, occurrence_ms: int) -> int:
        """The delay in [0, jitter_ms) of this occurrence: the same on every replay, in
        every process and on every engine (BLAKE2b, not Python's salted hash)."""
        if self.jitter_ms <= 1:
            return 0
        digest = hashlib.blake2b(f"{schedule_id}@{occurrence_ms}".encode(),
                                 digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.jitter_ms

    def describe(self) -> str:
        """The schedule in words, for people: ``every 15 min``, ``cron '0 9 * * 1-5'
        in Europe/Paris, at most 3 runs``."""
        if self.every_ms is not None:
            words = f"every {_duration(self.every_ms)}"
            if self.anchor_ms % self.every_ms:
                words += f" from {_utc(self.anchor_ms)}"
        else:
            words = f"cron '{self.cron}' in {self.tz}"
        if self.start_ms is not None:
            words += f", from {_utc(self.start_ms)}"
        if self.end_ms is not None:
            words += f", until {_utc(self.end_ms)}"
        if self.max_runs is not None:
            words += f", at most {self.max_runs} run{'s' if self.max_runs > 1 else ''}"
        if self.jitter_ms:
            words += f", up to {_duration(self.jitter_ms)} late by jitter"
        return words

    def fire_ms(self, schedule_id: str, occurrence_ms: int) -> int:
        """When the occurrence fires: its time plus its jitter, never before it."""
        if self.jitter_ms <= 1:
            return occurrence_ms  # the same int: a million held share it
        return occurrence_ms + self.jitter_for(schedule_id, occurrence_ms)

    def first_at_or_after(self, t_ms: int) -> int | None:
        """The first occurrence at ``t_ms`` or later (where a new series starts)."""
        return self.next_after(t_ms - 1)

    def plan(self, after_ms: int, now_ms: int, runs: int = 0, budget: int = 4096) -> Catchup:
        """Decide the occurrences in (after_ms, now_ms] by the misfire policy, looking at
        no more than ``budget`` of them (call again while ``more``). ``runs`` is how many
        the series has fired so far, for ``max_runs``.

        On time (within ``grace_ms`` of now) always fires. Older ones: ``latest`` fires
        the last of them unless one on time follows, ``all`` fires those within
        ``catchup_ms``, ``skip`` fires none."""
        fire: list[int] = []
        skipped = 0
        cursor = after_ms
        on_time_from = now_ms - self.grace_ms
        catchup_from = now_ms - self.catchup_ms
        o = self.next_after(cursor)
        if o is not None and o < on_time_from and self.every_ms is not None:
            o, skipped = self._skip_interval(o, now_ms)
            cursor = after_ms if skipped == 0 else o - self.every_ms
        looked = 0
        while o is not None and o <= now_ms and looked < budget:
            if self.max_runs is not None and runs + len(fire) >= self.max_runs:
                break
            looked += 1
            nxt = self.next_after(o)
            if o >= on_time_from or (self.misfire is Misfire.ALL and o >= catchup_from) or (
                    self.misfire is Misfire.LATEST and (nxt is None or nxt > now_ms)):
                fire.append(o)
            else:
                skipped += 1
            cursor = o
            o = nxt
        finished = o is None or (self.max_runs is not None
                                 and runs + len(fire) >= self.max_runs)
        more = not finished and o is not None and o <= now_ms
        return Catchup(tuple(fire), skipped, cursor, more, finished, looked)

    def _skip_interval(self, o: int, now_ms: int) -> tuple[int, int]:
        """For an interval, jump over the missed occurrences the policy would pass over
        one by one: to the last one before the on-time window (``latest``, which may
        fire it), or into the catch-up window (``all``)."""
        every = self.every_ms
        assert every is not None
        if self.misfire is Misfire.ALL:
            keep_from = now_ms - self.catchup_ms
        else:
            keep_from = now_ms - self.grace_ms
        if o >= keep_from:
            return o, 0
        # Occurrences o, o+every, ... below keep_from are skipped, except that latest
        # keeps the last of them (it may fire when nothing on time follows).
        n = (keep_from - o + every - 1) // every  # how many lie below keep_from
        if self.misfire is Misfire.LATEST:
            n -= 1
        if self.end_ms is not None:
            n = min(n, max(0, (self.end_ms - o) // every))
        return o + n * every, n


_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(Schedule)}
