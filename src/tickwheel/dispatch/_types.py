"""What a dispatcher's user provides and gets back."""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

__all__ = [
    "DispatcherClosed",
    "DispatcherOverloaded",
    "ProcessingResult",
    "TaskHolder",
    "TaskProcessor",
]

T = TypeVar("T")


class ProcessingResult(enum.Enum):
    """A processor's verdict on a task or a batch (one verdict for the whole batch)."""

    SUCCESS = "success"
    CONGESTION = "congestion"  # retried after congestion_retry_delay_ms
    TRANSIENT_ERROR = "transient_error"  # retried after network_failure_retry_ms
    PERMANENT_ERROR = "permanent_error"  # dropped, logged and counted


class TaskProcessor(Protocol[T]):
    """``process`` serves a non-batching dispatcher, ``process_batch`` a batching one
    (one verdict for the whole batch, as in Eureka)."""

    def process(self, task: T) -> ProcessingResult: ...

    def process_batch(self, tasks: list[T]) -> ProcessingResult: ...


class DispatcherClosed(RuntimeError):
    """``process`` was called after ``close()``."""


class DispatcherOverloaded(RuntimeError):
    """The acceptor queue is full: the acceptor thread is not keeping up."""


@dataclass(slots=True)
class TaskHolder(Generic[T]):
    id: Hashable
    task: T
    expiry_ms: int
    submit_ms: int = field(default=0)
