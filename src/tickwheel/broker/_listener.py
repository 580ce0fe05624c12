"""One small listener interface through which the broker models can be watched.

Every method has a no-op default: override what you need. The pipeline's workload
generator turns these calls into an event log; tests use them to see what happened.
"""

from __future__ import annotations

from collections.abc import Hashable

from tickwheel.purgatory import DelayedOperation, Outcome, Purgatory

__all__ = ["BrokerListener", "watch_observed"]


class BrokerListener:
    def produce_appended(self, partition: str, first_offset: int, last_offset: int,
                         size_bytes: int) -> None:
        """Records were appended to a leader's log."""

    def follower_fetched(self, partition: str, replica_id: int, fetch_offset: int) -> None:
        """A follower fetched from ``fetch_offset`` (its log end offset)."""

    def high_watermark_moved(self, partition: str, high_watermark: int) -> None:
        """The partition's high watermark advanced."""

    def heartbeat(self, group_id: str, member_id: str) -> None:
        """A liveness signal (heartbeat, join, sync or offset commit) from a member."""

    def member_expired(self, group_id: str, member_id: str) -> None:
        """A member's session expired; the group rebalances."""

    def operation_watched(self, op: DelayedOperation, keys: tuple[Hashable, ...]) -> None:
        """A delayed operation could not complete at once and is now watched."""

    def operation_resolved(self, op: DelayedOperation, outcome: Outcome) -> None:
        """A delayed operation completed, expired or was cancelled."""


def watch_observed(purgatory: Purgatory, op: DelayedOperation, keys: tuple[Hashable, ...],
                   listener: BrokerListener) -> bool:
    """``try_complete_else_watch`` with the listener told what happens to ``op``: when
    it is watched (it could not complete at once) and when it is resolved."""
    op.add_done_callback(lambda done: listener.operation_resolved(
        done, done.outcome or Outcome.CANCELLED))
    completed = purgatory.try_complete_else_watch(op, keys)
    if not completed and not op.is_completed:
        listener.operation_watched(op, keys)
    return completed
