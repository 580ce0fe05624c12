"""Consumer-group sessions: Kafka's group coordinator and its ``DelayedHeartbeat``.

Every liveness signal from a member (join, sync, heartbeat, offset commit) completes
the member's current ``DelayedHeartbeat`` (``check_and_complete(member key)``) and
schedules the next one, due one session timeout later
(``complete_and_schedule_next_expiration``). A heartbeat operation is satisfied when
the group is Dead, when it is rebalancing, or when a heartbeat arrived. If none of
that happens before the deadline, the member is removed and the group rebalances.

The operations share the group's lock (as in Kafka), so a heartbeat check never runs
concurrently with a change to the group.

The rebalance is reduced to its two steps: a join (or a member's failure) makes the
group prepare a rebalance, and every member must join again; a sync by a member that
did completes it: members that did not rejoin are removed (Kafka removes them when the
join phase ends), the group becomes Stable and the others start fresh sessions. Left
out: Kafka's rebalance timeout (``DelayedJoin``); here the join phase lasts until a
member syncs.
"""

from __future__ import annotations

import enum
import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from tickwheel._clock import Clock, SystemClock
from tickwheel.broker._listener import BrokerListener, watch_observed
from tickwheel.purgatory import DelayedOperation, Purgatory
from tickwheel.timers import TimingWheelTimer

__all__ = [
    "DelayedHeartbeat",
    "Group",
    "GroupCoordinator",
    "GroupError",
    "GroupState",
    "Member",
]

log = logging.getLogger(__name__)


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class GroupError(enum.Enum):
    NONE = "NONE"
    UNKNOWN_MEMBER_ID = "UNKNOWN_MEMBER_ID"
    REBALANCE_IN_PROGRESS = "REBALANCE_IN_PROGRESS"
    COORDINATOR_NOT_AVAILABLE = "COORDINATOR_NOT_AVAILABLE"


@dataclass(slots=True)
class Member:
    member_id: str
    session_timeout_ms: int
    latest_heartbeat_ms: int = 0
    heartbeat_satisfied: bool = False
    rejoined: bool = True


@dataclass(slots=True)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    members: dict[str, Member] = field(default_factory=dict)
    offsets: dict[str, int] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    @property
    def rebalancing(self) -> bool:
        return self.state in (GroupState.PREPARING_REBALANCE,
                              GroupState.COMPLETING_REBALANCE)


class DelayedHeartbeat(DelayedOperation):
    """One session period of one member, on the group's lock."""

    def __init__(self, coordinator: GroupCoordinator, group: Group, member: Member,
                 deadline_ms: int, session_timeout_ms: int) -> None:
        super().__init__(session_timeout_ms, group.lock)
        self.coordinator = coordinator
        self.group = group
        self.member = member
        self.deadline_ms = deadline_ms

    def try_complete(self) -> bool:
        return self.coordinator.try_complete_heartbeat(self)

    def on_complete(self) -> None:
        pass  # the next period was (or is being) scheduled by the signal itself

    def on_expiration(self) -> None:
        self.coordinator.on_expire_heartbeat(self)


class GroupCoordinator:
    """Groups, members and their sessions on one heartbeat purgatory."""

    def __init__(
        self,
        clock: Clock | None = None,
        listener: BrokerListener | None = None,
        on_rebalance: Callable[[Group], object] | None = None,
    ) -> None:
        self.clock = SystemClock() if clock is None else clock
        self.listener = listener or BrokerListener()
        self.on_rebalance = on_rebalance
        self.groups: dict[str, Group] = {}
        self.timer = TimingWheelTimer(clock=self.clock, executor=None)
        self.heartbeat_purgatory = Purgatory("Heartbeat", timer=self.timer, reaper=False)
        self.expired_members = 0
        self.removed_on_rebalance = 0
        self.rebalances = 0
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    # -- the requests --------------------------------------------------------------------

    def join_group(self, group_id: str, member_id: str | None,
                   session_timeout_ms: int) -> str:
        """Join (or rejoin); the group prepares a rebalance. Returns the member id."""
        if session_timeout_ms < 1:
            raise ValueError(f"session_timeout_ms must be >= 1, got {session_timeout_ms}")
        group = self._group(group_id)
        with group.lock:
            if member_id is None or member_id not in group.members:
                member_id = member_id or f"{group_id}-member-{next(self._ids)}"
                group.members[member_id] = Member(member_id, session_timeout_ms)
                self._prepare_rebalance(group)
            member = group.members[member_id]
            member.session_timeout_ms = session_timeout_ms
            member.rejoined = True
            self.complete_and_schedule_next_expiration(group, member)
        return member_id

    def sync_group(self, group_id: str, member_id: str) -> GroupError:
        """Complete the rebalance: members that did not rejoin are removed, the group
        becomes Stable with a new generation, and the others start fresh sessions."""
        group = self.groups.get(group_id)
        if group is None:
            return GroupError.UNKNOWN_MEMBER_ID
        with group.lock:
            member = group.members.get(member_id)
            if member is None:
                return GroupError.UNKNOWN_MEMBER_ID
            if group.rebalancing:
                if not member.rejoined:
                    return GroupError.REBALANCE_IN_PROGRESS  # join first
                for other in [m for m in group.members.values() if not m.rejoined]:
                    self._member_failed(group, other, "did not rejoin")
                    del group.members[other.member_id]
                    self.heartbeat_purgatory.cancel_for_key(
                        self.member_key(group.group_id, other.member_id))
                group.state = GroupState.STABLE
                group.generation += 1
                for other in list(group.members.values()):
                    if other is not member:
                        self.complete_and_schedule_next_expiration(group, other)
            self.complete_and_schedule_next_expiration(group, member)
        return GroupError.NONE

    def heartbeat(self, group_id: str, member_id: str) -> GroupError:
        group = self.groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            return GroupError.UNKNOWN_MEMBER_ID
        with group.lock:
            member = group.members.get(member_id)
            if member is None:
                return GroupError.UNKNOWN_MEMBER_ID
            self.complete_and_schedule_next_expiration(group, member)
            return GroupError.REBALANCE_IN_PROGRESS if group.rebalancing else GroupError.NONE

    def commit_offsets(self, group_id: str, member_id: str,
                       offsets: dict[str, int]) -> GroupError:
        group = self.groups.get(group_id)
        if group is None:
            return GroupError.UNKNOWN_MEMBER_ID
        with group.lock:
            member = group.members.get(member_id)
            if member is None:
                return GroupError.UNKNOWN_MEMBER_ID
            group.offsets.update(offsets)
            self.complete_and_schedule_next_expiration(group, member)
        return GroupError.NONE

    def leave_group(self, group_id: str, member_id: str) -> GroupError:
        group = self.groups.get(group_id)
        if group is None:
            return GroupError.UNKNOWN_MEMBER_ID
        with group.lock:
            if member_id not in group.members:
                return GroupError.UNKNOWN_MEMBER_ID
            self.heartbeat_purgatory.cancel_for_key(self.member_key(group_id, member_id))
            self._remove_member(group, member_id)
        return GroupError.NONE

    def remove_group(self, group_id: str) -> None:
        """The group is gone (Dead): its pending heartbeats are satisfied at once."""
        group = self.groups.pop(group_id)
        with group.lock:
            group.state = GroupState.DEAD
            for member_id in list(group.members):
                self.heartbeat_purgatory.check_and_complete(self.member_key(group_id,
                                                                            member_id))

    # -- Kafka's heartbeat logic ---------------------------------------------------------

    @staticmethod
    def member_key(group_id: str, member_id: str) -> tuple[str, str]:
        return (group_id, member_id)

    def complete_and_schedule_next_expiration(self, group: Group, member: Member) -> None:
        """A liveness signal: satisfy the current session, start the next one."""
        now = self.clock.now_ms()
        member.latest_heartbeat_ms = now
        member.heartbeat_satisfied = True
        key = self.member_key(group.group_id, member.member_id)
        self.heartbeat_purgatory.check_and_complete(key)
        self.listener.heartbeat(group.group_id, member.member_id)
        member.heartbeat_satisfied = False
        deadline = now + member.session_timeout_ms
        op = DelayedHeartbeat(self, group, member, deadline, member.session_timeout_ms)
        watch_observed(self.heartbeat_purgatory, op, (key,), self.listener)

    def try_complete_heartbeat(self, op: DelayedHeartbeat) -> bool:
        group = op.group
        with group.lock:
            if (group.state is GroupState.DEAD or group.rebalancing
                    or op.member.heartbeat_satisfied):
                return op.force_complete()
            return False

    def on_expire_heartbeat(self, op: DelayedHeartbeat) -> None:
        group, member = op.group, op.member
        with group.lock:
            if group.members.get(member.member_id) is not member:
                return  # it left, or the group is gone
            if (group.state is GroupState.DEAD or group.rebalancing
                    or member.latest_heartbeat_ms + member.session_timeout_ms > op.deadline_ms):
                return  # kept alive: a rebalance is on, or a newer session has started
            self._member_failed(group, member, "session expired")
            self._remove_member(group, member.member_id)

    # -- internals -----------------------------------------------------------------------

    def _group(self, group_id: str) -> Group:
        with self._lock:
            group = self.groups.get(group_id)
            if group is None:
                group = self.groups[group_id] = Group(group_id)
            return group

    def _member_failed(self, group: Group, member: Member, why: str) -> None:
        log.info("group %s: member %s removed: %s", group.group_id, member.member_id, why)
        with self._lock:
            if why == "session expired":
                self.expired_members += 1
            else:
                self.removed_on_rebalance += 1
        self.listener.member_expired(group.group_id, member.member_id)

    def _remove_member(self, group: Group, member_id: str) -> None:
        del group.members[member_id]
        if group.members:
            self._prepare_rebalance(group)
        else:
            group.state = GroupState.EMPTY

    def _prepare_rebalance(self, group: Group) -> None:
        if group.state is GroupState.PREPARING_REBALANCE:
            return
        group.state = GroupState.PREPARING_REBALANCE
        for member in group.members.values():
            member.rejoined = False  # everyone joins again
        with self._lock:
            self.rebalances += 1
        if self.on_rebalance is not None:
            self.on_rebalance(group)

    # -- time ----------------------------------------------------------------------------

    def advance_clock(self, timeout_ms: int = 0) -> bool:
        return self.heartbeat_purgatory.advance_clock(timeout_ms)

    def close(self) -> None:
        self.heartbeat_purgatory.close()
        self.timer.close()
