"""The read view: what the local engine holds as of its last committed batch, read by id,
paged in id order, without touching the engine's state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sortedcontainers")
pytest.importorskip("pyarrow")

from tests.service.viewed import Service, row, schedule, watch
from tickwheel.service import view as view_module
from tickwheel.service.view import MAX_PAGE, PageError, StateView


@pytest.fixture
def service(tmp_path: Path) -> Any:
    running = Service(tmp_path)
    yield running
    running.close()


def test_a_schedule_reads_with_its_spec_state_next_fire_and_runs(service: Service) -> None:
    service.feed([schedule(1_000, "hourly", every_ms=3_600_000, anchor_ms=0)], 2_000)
    found = service.view.schedule("hourly")
    assert found is not None
    assert (found.state, found.next_fire_ms, found.runs, found.skipped) == (
        "running", 3_600_000, 0, 0)
    assert found.spec == {"every_ms": 3_600_000, "anchor_ms": 0}
    assert found.upcoming == tuple(3_600_000 * n for n in range(1, 6))
    assert found.last_fired_ms is None


def test_runs_and_last_fired_follow_the_fires(service: Service) -> None:
    service.feed([schedule(1_000, "s", every_ms=1_000, anchor_ms=0)], 1_500)
    service.feed([], 4_200)  # fires 2,000, 3,000 and 4,000 (released up to 4,100)
    found = service.view.schedule("s")
    assert found is not None
    assert (found.runs, found.last_fired_ms, found.next_fire_ms) == (3, 4_000, 5_000)


def test_a_schedule_at_its_end_lists_fewer_upcoming_fires(service: Service) -> None:
    service.feed([schedule(1_000, "few", every_ms=1_000, anchor_ms=0, max_runs=3)], 1_500)
    service.feed([], 2_200)
    found = service.view.schedule("few")
    assert found is not None and found.runs == 1
    assert found.upcoming == (3_000, 4_000)


def test_pause_resume_and_unschedule_show_in_the_view(service: Service) -> None:
    service.feed([schedule(1_000, "a", every_ms=60_000, anchor_ms=0),
                  schedule(1_000, "b", every_ms=60_000, anchor_ms=0)], 1_200)
    service.feed([row(1_300, "pause", "a")], 1_500)
    paused = service.view.schedule("a")
    assert paused is not None
    assert (paused.state, paused.next_fire_ms, paused.upcoming) == ("paused", None, ())
    assert [s.schedule_id for s in service.view.page(state="paused").schedules] == ["a"]
    assert [s.schedule_id for s in service.view.page(state="running").schedules] == ["b"]
    service.feed([row(1_600, "resume", "a"), row(1_600, "unschedule", "b")], 1_800)
    resumed = service.view.schedule("a")
    assert resumed is not None and resumed.state == "running"
    assert resumed.next_fire_ms == 60_000
    assert service.view.schedule("b") is None
    assert service.view.page(state="paused").schedules == []


def test_pages_go_in_id_order_by_prefix_with_a_cursor(service: Service) -> None:
    ids = [f"order-{n:03d}" for n in range(25)] + ["other-1", "a-first"]
    service.feed([schedule(1_000, i, every_ms=60_000, anchor_ms=0) for i in ids], 1_200)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = service.view.page(prefix="order-", limit=10, cursor=cursor)
        seen += [s.schedule_id for s in page.schedules]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == sorted(i for i in ids if i.startswith("order-"))
    assert pages == 3
    assert page.as_of_ms == 1_099  # rows up to 1,099 ms are applied (lateness 100)
    everything = service.view.page(limit=MAX_PAGE)
    assert [s.schedule_id for s in everything.schedules] == sorted(ids)
    assert everything.next_cursor is None


def test_a_page_looks_at_a_bounded_number_of_schedules(service: Service,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(view_module, "MAX_SCANNED", 5)
    service.feed([schedule(1_000, f"s{n:02d}", every_ms=60_000, anchor_ms=0)
                  for n in range(12)] + [row(1_001, "pause", "s11")], 1_200)
    page = service.view.page(state="running", limit=100)
    assert len(page.schedules) == 5 and page.next_cursor is not None
    found = [s.schedule_id for s in page.schedules]
    while page.next_cursor is not None:
        page = service.view.page(state="running", limit=100, cursor=page.next_cursor)
        found += [s.schedule_id for s in page.schedules]
    assert found == [f"s{n:02d}" for n in range(11)]


@pytest.mark.parametrize(("arguments", "named"), [
    ({"cursor": "!!not base64!!"}, "cursor"),
    ({"cursor": "_w"}, "cursor"),  # decodes to a byte that is not UTF-8
    ({"state": "stopped"}, "state"),
    ({"limit": 0}, "limit"),
    ({"limit": MAX_PAGE + 1}, "limit"),
])
def test_malformed_page_arguments_are_refused_naming_them(
        arguments: dict[str, Any], named: str) -> None:
    with pytest.raises(PageError, match=named):
        StateView().page(**arguments)


def test_a_pending_operation_reads_with_its_deadline_and_keys(service: Service) -> None:
    service.feed([watch(1_000, "order-17", 30_000, ["pay:17", "ship:17"])], 1_200)
    found = service.view.operation("order-17")
    assert found is not None
    assert found.as_json() == {"op_id": "order-17", "state": "pending", "watched_ms": 1_000,
                               "deadline_ms": 30_000, "keys": ["pay:17", "ship:17"],
                               "condition": "any_update"}
    stats = service.view.stats(next_deadlines=3)
    assert stats.pending == 1 and stats.next_deadlines == ((30_000, "order-17"),)


def test_a_resolved_operation_reads_with_its_outcome(service: Service) -> None:
    service.feed([watch(1_000, "quick", 2_000), watch(1_000, "slow", 90_000)], 1_200)
    service.feed([{"ts_ms": 1_500, "type": "update", "key": "k", "value": 1}], 2_500)
    quick = service.view.operation("quick")
    assert quick is not None
    assert quick.as_json() == {"op_id": "quick", "state": "resolved",
                               "outcome": "completed", "resolved_ms": 1_500}
    assert service.view.operation("slow") is not None
    assert service.view.operation("never") is None
    assert service.view.stats(next_deadlines=5).next_deadlines == ()


def test_a_resolved_operation_is_forgotten_with_its_id(tmp_path: Path) -> None:
    running = Service(tmp_path, dedupe_retention_ms=5_000)
    try:
        running.feed([watch(1_000, "gone", 2_000)], 3_000)
        resolved = running.view.operation("gone")
        assert resolved is not None and resolved.outcome == "expired"
        running.feed([watch(9_000, "later", 90_000)], 9_500)
        assert running.view.operation("gone") is None
    finally:
        running.close()


def test_a_restarted_engine_gives_the_view_every_entry_it_holds(tmp_path: Path) -> None:
    first = Service(tmp_path)
    first.feed([schedule(1_000, "kept", every_ms=60_000, anchor_ms=0),
                watch(1_000, "waiting", 90_000)], 1_500)
    first.feed([row(1_600, "pause", "kept")], 1_800)
    first.close()
    again = Service(tmp_path, clock_ms=1_800)
    try:
        kept = again.view.schedule("kept")
        assert kept is not None and kept.state == "paused"
        waiting = again.view.operation("waiting")
        assert waiting is not None and waiting.deadline_ms == 90_000
        assert again.view.as_of_ms == 1_699
    finally:
        again.close()


def test_a_restart_remembers_outcomes_and_last_fires_from_the_outputs(
        tmp_path: Path) -> None:
    from tickwheel.pipeline.io.outputs import recent_outcomes

    first = Service(tmp_path, dedupe_retention_ms=60_000)
    first.feed([schedule(1_000, "s", every_ms=1_000, anchor_ms=0),
                watch(1_000, "gone", 1_500), watch(1_000, "waiting", 90_000)], 1_200)
    first.feed([], 3_200)  # "gone" expires; "s" fires at 2,000 and 3,000
    first.close()
    again = Service(tmp_path, dedupe_retention_ms=60_000, clock_ms=3_200)
    try:
        assert again.view.operation("gone") is None  # the engine holds no outcome
        again.view.remember(recent_outcomes(tmp_path / "out" / "outcomes", 3_099 - 60_000,
                                            1_000))
        gone = again.view.operation("gone")
        assert gone is not None and (gone.outcome, gone.resolved_ms) == ("expired", 1_500)
        fired = again.view.schedule("s")
        assert fired is not None and fired.last_fired_ms == 3_000
        waiting = again.view.operation("waiting")
        assert waiting is not None and waiting.state == "pending"
        assert [o.op_id for o in again.view.recent_outcomes()][:2] == ["s@3000", "s@2000"]
    finally:
        again.close()


def test_outcomes_read_back_stop_at_the_window_and_the_limit(tmp_path: Path) -> None:
    from tickwheel.pipeline.io.outputs import recent_outcomes

    running = Service(tmp_path)
    try:
        for n in range(5):  # a batch, and an outcome file, each
            running.feed([watch(1_000 + n * 1_000, f"op-{n}", 1_500 + n * 1_000)],
                         2_000 + n * 1_000)
        running.feed([], 10_000)
    finally:
        running.close()
    outcomes = tmp_path / "out" / "outcomes"
    assert [r[0] for r in recent_outcomes(outcomes, 0, 100)] == [f"op-{n}" for n in range(5)]
    assert [r[0] for r in recent_outcomes(outcomes, 3_500, 100)] == ["op-2", "op-3", "op-4"]
    assert [r[0] for r in recent_outcomes(outcomes, 0, 2)] == ["op-3", "op-4"]
