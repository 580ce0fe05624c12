"""Consumer-group sessions on the heartbeat purgatory (seed 004)."""

from __future__ import annotations

import pytest

from tickwheel import ManualClock
from tickwheel.broker import BrokerListener
from tickwheel.broker.groups import GroupCoordinator, GroupError, GroupState


class Recorder(BrokerListener):
    def __init__(self) -> None:
        self.expired: list[tuple[str, str]] = []
        self.heartbeats = 0

    def heartbeat(self, group_id: str, member_id: str) -> None:
        self.heartbeats += 1

    def member_expired(self, group_id: str, member_id: str) -> None:
        self.expired.append((group_id, member_id))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(0)


@pytest.fixture
def coordinator(clock: ManualClock) -> GroupCoordinator:
    return GroupCoordinator(clock=clock, listener=Recorder())


def run_for(coordinator: GroupCoordinator, clock: ManualClock, ms: int, step: int = 100,
            beat: list[str] | None = None, every: int = 3_000) -> None:
    elapsed = 0
    while elapsed < ms:
        clock.advance(step)
        elapsed += step
        if beat and elapsed % every == 0:
            for m in beat:
                assert coordinator.heartbeat("g", m) is not GroupError.UNKNOWN_MEMBER_ID
        coordinator.advance_clock(0)


def stable_group(coordinator: GroupCoordinator, n: int) -> list[str]:
    members = [coordinator.join_group("g", None, session_timeout_ms=10_000) for _ in range(n)]
    assert coordinator.sync_group("g", members[0]) is GroupError.NONE
    assert coordinator.groups["g"].state is GroupState.STABLE
    return members


def test_a_steady_member_never_expires(coordinator: GroupCoordinator,
                                       clock: ManualClock) -> None:
    [m] = stable_group(coordinator, 1)
    run_for(coordinator, clock, 120_000, beat=[m])
    assert m in coordinator.groups["g"].members
    assert coordinator.expired_members == 0
    # One session at a time: the current heartbeat operation, watched once.
    hp = coordinator.heartbeat_purgatory
    assert (hp.num_delayed, hp.watched, hp.num_keys) == (1, 1, 1)


def test_missed_heartbeats_expire_the_member_and_trigger_a_rebalance(
        coordinator: GroupCoordinator, clock: ManualClock) -> None:
    alive, crashed = stable_group(coordinator, 2)
    rebalances_before = coordinator.rebalances
    run_for(coordinator, clock, 9_900, beat=[alive])
    assert crashed in coordinator.groups["g"].members
    run_for(coordinator, clock, 200, beat=[alive])  # past 10 s since the sync
    group = coordinator.groups["g"]
    assert crashed not in group.members and alive in group.members
    assert group.state is GroupState.PREPARING_REBALANCE
    assert coordinator.expired_members == 1
    assert coordinator.rebalances == rebalances_before + 1
    assert coordinator.listener.expired == [("g", crashed)]  # type: ignore[attr-defined]
    assert coordinator.heartbeat("g", crashed) is GroupError.UNKNOWN_MEMBER_ID
    assert coordinator.heartbeat("g", alive) is GroupError.REBALANCE_IN_PROGRESS


def test_every_liveness_signal_keeps_a_member_alive(coordinator: GroupCoordinator,
                                                    clock: ManualClock) -> None:
    [m] = stable_group(coordinator, 1)
    for signal in (lambda: coordinator.commit_offsets("g", m, {"t-0": 5}),
                   lambda: coordinator.heartbeat("g", m),
                   lambda: coordinator.join_group("g", m, 10_000),
                   lambda: coordinator.sync_group("g", m)):
        run_for(coordinator, clock, 9_000)
        signal()
    run_for(coordinator, clock, 9_000)
    assert m in coordinator.groups["g"].members
    assert coordinator.expired_members == 0


def test_a_rebalance_keeps_members_alive_and_removes_those_that_do_not_rejoin(
        coordinator: GroupCoordinator, clock: ManualClock) -> None:
    a, b = stable_group(coordinator, 2)
    c = coordinator.join_group("g", None, 10_000)  # a newcomer starts a rebalance
    run_for(coordinator, clock, 30_000)  # nobody heartbeats, but the group is rebalancing
    group = coordinator.groups["g"]
    assert set(group.members) == {a, b, c}
    assert coordinator.sync_group("g", a) is GroupError.REBALANCE_IN_PROGRESS  # join first
    coordinator.join_group("g", a, 10_000)
    assert coordinator.sync_group("g", a) is GroupError.NONE
    assert set(group.members) == {a, c}  # b never rejoined
    assert coordinator.removed_on_rebalance == 1
    assert coordinator.listener.expired == [("g", b)]  # type: ignore[attr-defined]
    run_for(coordinator, clock, 10_100)  # fresh sessions, and nobody heartbeats
    # One expires first; its departure starts a rebalance that keeps the other alive.
    assert coordinator.expired_members == 1 and len(group.members) == 1
    assert group.state is GroupState.PREPARING_REBALANCE
    [last] = group.members
    coordinator.join_group("g", last, 10_000)
    coordinator.sync_group("g", last)
    run_for(coordinator, clock, 10_100)
    assert coordinator.expired_members == 2 and group.members == {}
    assert group.state is GroupState.EMPTY


def test_leave_group_cancels_the_session(coordinator: GroupCoordinator,
                                         clock: ManualClock) -> None:
    a, b = stable_group(coordinator, 2)
    assert coordinator.leave_group("g", b) is GroupError.NONE
    hp = coordinator.heartbeat_purgatory
    assert hp.stats().cancelled == 1 and hp.watched == 1
    run_for(coordinator, clock, 20_000, beat=[a])
    assert coordinator.expired_members == 0


def test_a_dead_group_satisfies_pending_heartbeats(coordinator: GroupCoordinator) -> None:
    stable_group(coordinator, 3)
    coordinator.remove_group("g")
    hp = coordinator.heartbeat_purgatory
    assert (hp.num_delayed, hp.watched) == (0, 0)
    assert hp.stats().completed >= 3
