"""Argument checks shared by every layer: bad input fails early, naming the argument."""

from __future__ import annotations

import math
import numbers
from typing import SupportsFloat, TypeAlias

__all__ = ["Millis", "check_delay_ms", "check_positive_int", "check_timeout"]

#: What the public API takes for a time in milliseconds: any real number (an int is
#: kept exact, however large; a float is rounded up). Typed as a protocol rather than
#: ``float`` so that the compiled core neither converts ints to floats nor rejects bad
#: input before the check below can name the argument.
Millis: TypeAlias = SupportsFloat


def check_delay_ms(name: str, value: object) -> int:
    """A delay or deadline in ms as an int; a finite float rounds up, so never early."""
    if type(value) is int:
        return value
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number of milliseconds, got {value!r}")
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float | numbers.Real):
        as_float = float(value)
        if math.isnan(as_float) or math.isinf(as_float):
            raise ValueError(f"{name} must be a finite number of milliseconds, got {value!r}")
        return int(math.ceil(value))  # noqa: RUF046 - ceil of a Decimal or Fraction
    raise TypeError(
        f"{name} must be a number of milliseconds, got {type(value).__name__} {value!r}"
    )


def check_positive_int(name: str, value: object, minimum: int = 1,
                       maximum: int | None = None) -> int:
    """An int size or count that must be at least ``minimum`` (and at most ``maximum``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return int(value)


def check_timeout(name: str, value: object) -> float:
    """A timeout in seconds: a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float | numbers.Real):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__} "
                        f"{value!r}")
    seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return seconds
