"""Local wall times to instants in an IANA zone, with the daylight-saving rule.

A local time that does not exist (the spring-forward gap) maps to the first instant
after the gap: the transition itself. A local time that occurs twice (fall back) maps to
its first occurrence. Both keep the mapping monotonic, which is what lets a cron search
walk local times in order and stop at the first instant past the one it was given; a
frequent spec's second pass of a repeated hour is found apart (:func:`repeated_window`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["ZoneError", "instant_ms", "load_zone", "local_of", "repeated_window", "wall_ms"]

_EPOCH = datetime(1970, 1, 1)
#: Names a zone database may hold that are no IANA zone: the host's own zone (which
#: would make occurrences depend on the machine) and the database's template.
_HOST_NAMES = frozenset({"localtime", "posixrules"})
#: Trees of copies with other rules (leap seconds in ``right/``), no IANA names.
_OTHER_TREES = ("posix/", "right/")


class ZoneError(ValueError):
    """An IANA zone name that is unknown or malformed."""


def load_zone(name: str) -> tzinfo:
    """The zone called ``name`` ("UTC" without reading the zone database)."""
    if not isinstance(name, str) or not name:
        raise ZoneError(f"tz must be an IANA zone name such as 'Europe/London', got {name!r}")
    if name in ("UTC", "Etc/UTC"):
        return UTC
    if name in _HOST_NAMES or name.startswith(_OTHER_TREES):
        raise ZoneError(f"tz {name!r} is not an IANA zone name: it names the host's own "
                        "zone or a copy with other rules, so times would depend on the "
                        "machine; name the zone, such as 'Europe/London'")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ZoneError(f"tz {name!r} is not a known IANA zone name ({exc})") from None


def local_of(ms: int, zone: tzinfo) -> datetime:
    """The naive local wall time of the instant ``ms``, with its fold (PEP 495): the
    second pass of a repeated hour has fold=1."""
    utc = _EPOCH + timedelta(milliseconds=ms)
    if zone is UTC:
        return utc
    aware = utc.replace(tzinfo=UTC).astimezone(zone)
    return aware.replace(tzinfo=None)


def _offset_ms(naive: datetime, zone: tzinfo, fold: int) -> int:
    offset = zone.utcoffset(naive.replace(fold=fold))
    assert offset is not None, "a zone with no offset"
    return offset // timedelta(milliseconds=1)


def _offset_at(ms: int, zone: tzinfo) -> timedelta | None:
    return (_EPOCH + timedelta(milliseconds=ms)).replace(tzinfo=UTC).astimezone(zone).utcoffset()


def repeated_window(ms: int, zone: tzinfo, local: datetime | None = None,
                    ) -> tuple[int, int, int] | None:
    """Where the instant ``ms`` (whose :func:`local_of` is ``local``, if known) falls in
    either pass of a repeated hour (fall back): ``(transition, offset before, offset
    after)`` in ms, the transition being the first instant of the second pass; None
    elsewhere."""
    if zone is UTC:
        return None
    if local is None:
        local = local_of(ms, zone)
    before = _offset_ms(local, zone, 0)
    after = _offset_ms(local, zone, 1)
    if before <= after:
        return None  # occurs once (or, read as a gap, does not: never for a real instant)
    # The transition lies within one shift of ``ms``, on the side its fold says.
    lo, hi = (ms - (before - after), ms) if local.fold else (ms, ms + (before - after))
    return _transition(lo, hi, zone), before, after


def _transition(lo: int, hi: int, zone: tzinfo) -> int:
    """The first instant in (lo, hi] whose offset is not ``lo``'s, by bisection: the
    one transition between them."""
    base = _offset_at(lo, zone)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _offset_at(mid, zone) == base:
            lo = mid
        else:
            hi = mid
    return hi


def wall_ms(naive: datetime) -> int:
    """The naive time read as if it were UTC, in ms."""
    return (naive - _EPOCH) // timedelta(milliseconds=1)


def instant_ms(local: datetime, zone: tzinfo) -> int:
    """The instant of the naive local time ``local``: its first occurrence if it occurs
    twice, the end of the gap if it does not occur at all."""
    wall = wall_ms(local)
    if zone is UTC:
        return wall
    before = wall - _offset_ms(local, zone, 0)  # fold=0: the offset in force before
    if wall_ms(local_of(before, zone)) == wall:
        return before  # exists; fold=0 is its first occurrence if it repeats
    # In a gap: fold=0 reads the offset before the transition, fold=1 the one after,
    # so the transition lies between the two readings. Find it by bisection.
    after = wall - _offset_ms(local, zone, 1)
    return _transition(min(before, after), max(before, after), zone)
