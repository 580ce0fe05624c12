"""The asyncio benchmark measures what it says: A3's wakes happen after every task is
asleep, and never before the deadlines they count from."""

from __future__ import annotations

import asyncio
import time

import pytest

from benchmarks._asyncio import _data, measure


@pytest.mark.parametrize("loop", ["asyncio", "tickwheel"])
def test_a3_wakes_every_task_after_its_deadline_spread_over_a_second(loop: str) -> None:
    n = 3_000
    offsets = _data("A3", n, 0)
    rate = measure(loop, "A3", n, 0)
    # The last wake comes no earlier than the latest deadline, so the rate cannot
    # exceed n over the spread; a loop that keeps up with 3,000 wakes comes near it.
    assert n / 10 < rate <= n / max(offsets)


def test_a3_refuses_a_run_whose_tasks_were_not_all_asleep_by_the_first_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sleep = asyncio.sleep

    async def slow_to_start(delay: float) -> None:
        if delay > 0:
            time.sleep(0.003)  # each task's first step: 1,000 of them outlast the lead
        await sleep(delay)

    monkeypatch.setattr(asyncio, "sleep", slow_to_start)
    with pytest.raises(RuntimeError, match="not all asleep by the first deadline"):
        measure("tickwheel", "A3", 1_000, 0)
