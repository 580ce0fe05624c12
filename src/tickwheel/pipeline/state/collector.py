"""The garbage collector paused while a batch runs, in either engine, and what outlives
batches kept out of its walk (:class:`CollectorFreezer`).

A batch makes hundreds of thousands of objects that outlive it (held rows,
operations, seen ids), none garbage through a cycle worth collecting at once, and the
collector would walk them all dozens of times. In a service a full collection inside a
batch would also delay the batch's outcomes by its whole length (docs/follow.md has
the measurement); paused, the collections that are due run once the batch has written
its outputs. The pause ends with the batch; a following engine freezes what the batch
made before it ends, or the first young collection would walk all of it at once.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["CollectorFreezer", "collector_paused"]


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


class CollectorFreezer:
    """Every object alive after a batch taken out of the collector's walk
    (``gc.freeze``), except once every ``thaw_every_s``, when they all go back
    (``gc.unfreeze``) and the next full collection walks everything once.

    An engine holds millions of objects across batches (pending operations, held rows,
    seen ids), and each full collection walks them all: with 1.2M operations pending, a
    full collection takes a second and stops every thread of the process (a submit
    server's requests wait it out). Frozen objects are still freed when their last
    reference goes; only garbage in reference cycles among them waits for the thaw (a
    resolved operation leaves none: 100,000 expiries left 357 objects in cycles)."""

    def __init__(self, thaw_every_s: float) -> None:
        self.thaw_every_s = thaw_every_s
        self.thawed_at: float | None = None

    def after_batch(self, now: float) -> None:
        """Freeze what is alive, or thaw once ``thaw_every_s`` has passed since the
        last thaw (``now`` is ``time.monotonic()``)."""
        if self.thawed_at is None:
            self.thawed_at = now
        if now - self.thawed_at >= self.thaw_every_s:
            gc.unfreeze()
            self.thawed_at = now
        else:
            gc.freeze()

