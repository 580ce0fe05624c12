"""A virtual clock for event loops: the selector advances ``loop.time()`` by the
timeout the loop asks it to sleep, so timers fire at exact virtual times and no test
waits for real time to pass."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import tickwheel.aio as aio


class VirtualSelector(selectors.SelectSelector):
    def __init__(self, start: float = 1000.0) -> None:
        super().__init__()
        self.now = start
        self.timeouts: list[float | None] = []

    def select(self, timeout: float | None = None) -> list[Any]:
        self.timeouts.append(timeout)
        if timeout is None:
            raise AssertionError("the loop would sleep forever on a virtual clock")
        self.now += timeout
        return super().select(0)


def virtual_loop(factory: Callable[[selectors.BaseSelector], asyncio.AbstractEventLoop],
                 start: float = 1000.0) -> tuple[asyncio.AbstractEventLoop, VirtualSelector]:
    selector = VirtualSelector(start)
    loop = factory(selector)
    loop.time = lambda: selector.now  # type: ignore[method-assign]
    return loop, selector


def stock(selector: selectors.BaseSelector) -> asyncio.AbstractEventLoop:
    return asyncio.SelectorEventLoop(selector)


def wheel(selector: selectors.BaseSelector) -> asyncio.AbstractEventLoop:
    return aio.EventLoop(selector)


@pytest.fixture
def vloop() -> Iterator[tuple[aio.EventLoop, VirtualSelector]]:
    loop, selector = virtual_loop(wheel)
    assert isinstance(loop, aio.EventLoop)
    yield loop, selector
    loop.close()
