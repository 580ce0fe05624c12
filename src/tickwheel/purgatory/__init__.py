"""The purgatory: delayed operations watched by keys (Kafka's DelayedOperationPurgatory)."""

from tickwheel.purgatory._futures import DelayedFuture
from tickwheel.purgatory._operation import DelayedOperation, Outcome
from tickwheel.purgatory._purgatory import Purgatory, PurgatoryStats

__all__ = ["DelayedFuture", "DelayedOperation", "Outcome", "Purgatory", "PurgatoryStats"]
