"""Processors that ``tickwheel run --processor`` loads by name in the tests."""

from __future__ import annotations

from tickwheel import ProcessingResult
from tickwheel.pipeline.contract.outcomes import OutcomeRow

#: What :class:`Collect` instances were given, in order.
COLLECTED: list[OutcomeRow] = []


class Collect:
    """Keeps every outcome; congested on its first call, so a retry is exercised."""

    def __init__(self) -> None:
        self.calls = 0

    def process(self, task: OutcomeRow) -> ProcessingResult:
        return self.process_batch([task])

    def process_batch(self, tasks: list[OutcomeRow]) -> ProcessingResult:
        self.calls += 1
        if self.calls == 1:
            return ProcessingResult.CONGESTION
        COLLECTED.extend(tasks)
        return ProcessingResult.SUCCESS


class Stuck:
    """Never returns: a processor hung on a dead downstream."""

    def process(self, task: OutcomeRow) -> ProcessingResult:
        return self.process_batch([task])

    def process_batch(self, tasks: list[OutcomeRow]) -> ProcessingResult:
        import threading

        threading.Event().wait()
        raise AssertionError("unreachable")


class Congested:
    """Always congested: nothing is ever settled."""

    def process(self, task: OutcomeRow) -> ProcessingResult:
        return ProcessingResult.CONGESTION

    def process_batch(self, tasks: list[OutcomeRow]) -> ProcessingResult:
        return ProcessingResult.CONGESTION


class Raises:
    """Raises on every call."""

    def process(self, task: OutcomeRow) -> ProcessingResult:
        raise RuntimeError("downstream exploded")

    def process_batch(self, tasks: list[OutcomeRow]) -> ProcessingResult:
        raise RuntimeError("downstream exploded")
