"""A processor for `tickwheel run --processor`: the engine hands it each batch's
outcomes (at least once: a batch not settled before a stop is handed over again at the
next start), and its answer says whether they are done or to be retried.

    tickwheel generate --events 20000 --output events/
    PYTHONPATH=examples tickwheel run --input events/ --output out/ \\
        --processor outcome_processor:CountByOutcome

Each outcome is a :class:`tickwheel.pipeline.OutcomeRow`: ``op_id``, ``outcome``
(completed, expired, cancelled, error, fired), ``resolved_ms``, ``latency_ms``,
``keys``, ``error``, and ``skipped`` (a fired schedule's missed occurrences).
"""

from __future__ import annotations

import atexit
import collections
import threading

from tickwheel import ProcessingResult
from tickwheel.pipeline import OutcomeRow


class CountByOutcome:
    """Counts outcomes by kind and prints the counts as the process exits. Made once,
    with no arguments; called from the dispatcher's worker threads."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        atexit.register(self.report)

    def process(self, task: OutcomeRow) -> ProcessingResult:
        return self.process_batch([task])

    def process_batch(self, tasks: list[OutcomeRow]) -> ProcessingResult:
        with self._lock:
            self.counts.update(row.outcome.value for row in tasks)
        # CONGESTION or TRANSIENT_ERROR would have the batch sent again after a pause;
        # PERMANENT_ERROR drops it.
        return ProcessingResult.SUCCESS

    def report(self) -> None:
        with self._lock:
            print("outcomes by kind:", dict(sorted(self.counts.items())))
