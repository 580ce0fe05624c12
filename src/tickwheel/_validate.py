"""Argument checks shared by every layer: bad input fails early, naming the argument."""

from __future__ import annotations

import math

__all__ = ["check_delay_ms", "check_positive_int"]


def check_delay_ms(name: str, value: object) -> int:
    """A delay or deadline in ms as an int; a finite float rounds up, so never early."""
    if type(value) is int:
        return value
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number of milliseconds, got {value!r}")
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ValueError(f"{name} must be a finite number of milliseconds, got {value!r}")
        return math.ceil(value)
    raise TypeError(
        f"{name} must be a number of milliseconds, got {type(value).__name__} {value!r}"
    )


def check_positive_int(name: str, value: object, minimum: int = 1) -> int:
    """An int size or count that must be at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)
