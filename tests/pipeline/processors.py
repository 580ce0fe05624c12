"""Processors that ``tickwheel run --processor`` loads by name in the tests."""

from __future__ import annotations

from tickwheel import ProcessingResult
from tickwheel.pipeline.resolver import OutcomeRow

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
