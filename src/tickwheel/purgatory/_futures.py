"""DelayedFuture: complete when a set of futures is done, or fail the rest on timeout.

Kafka's ``DelayedFuturePurgatory`` watches every such operation on one shared key, so
each finished future retries all of them; here each operation has a key of its own.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any

from tickwheel._validate import Millis
from tickwheel.purgatory._operation import DelayedOperation

__all__ = ["DelayedFuture"]

_ids = itertools.count()


class DelayedFuture(DelayedOperation):
    """Completes once every future is done; at the deadline, the futures still pending
    fail with ``TimeoutError``. Either way ``callback(futures)`` runs exactly once."""

    __slots__ = ("_callback", "futures", "key")

    def __init__(
        self,
        delay_ms: Millis,
        futures: Sequence[Future[Any]],
        callback: Callable[[Sequence[Future[Any]]], object],
    ) -> None:
        super().__init__(delay_ms)
        self.futures = tuple(futures)
        self._callback = callback
        self.key = ("delayed-future", next(_ids))

    def try_complete(self) -> bool:
        if all(f.done() for f in self.futures):
            return self.force_complete()
        return False

    def on_expiration(self) -> None:
        pass  # the futures were failed in on_complete, before the callback saw them

    def on_complete(self) -> None:
        for f in self.futures:
            if not f.done():
                with contextlib.suppress(InvalidStateError):  # it finished meanwhile
                    f.set_exception(TimeoutError(f"not done within {self.delay_ms} ms"))
        self._callback(self.futures)
