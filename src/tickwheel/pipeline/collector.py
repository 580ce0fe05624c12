"""The garbage collector paused while a batch runs, in either engine.

A batch makes hundreds of thousands of objects that outlive it (held rows,
operations, seen ids), none garbage through a cycle worth collecting at once, and the
collector would walk them all dozens of times. In a service a full collection inside a
batch would also delay the batch's outcomes by its whole length (docs/follow.md has
the measurement); paused, the collections that are due run once the batch has written
its outputs. The pause ends with the batch.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["collector_paused"]


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic collection inside the block; the collector is enabled again after
    it, unless it was off before."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
