"""Batched dispatch of work: Eureka's acceptor, batcher, workers and traffic shaper."""

from tickwheel.dispatch._dispatcher import (
    DispatcherStats,
    TaskDispatcher,
    create_batching_dispatcher,
    create_non_batching_dispatcher,
)
from tickwheel.dispatch._types import (
    DispatcherClosed,
    DispatcherOverloaded,
    ProcessingResult,
    TaskProcessor,
)

__all__ = [
    "DispatcherClosed",
    "DispatcherOverloaded",
    "DispatcherStats",
    "ProcessingResult",
    "TaskDispatcher",
    "TaskProcessor",
    "create_batching_dispatcher",
    "create_non_batching_dispatcher",
]
