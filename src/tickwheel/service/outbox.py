"""Outbox: where a run's outcomes go, a dispatcher per target.

Each target has its own :class:`~tickwheel.pipeline.delivery.sink.OutcomeSink` (Eureka's
acceptor, batcher and workers) over its own :class:`~tickwheel.service.webhook.WebhookProcessor`,
and the engines deliver to each on a thread of its own with a mark of its own
(:class:`~tickwheel.pipeline.delivery.batch_delivery.Deliveries`): a target that hangs
or answers 503 holds up its own outcomes only. Outcomes naming a target that no target
has go to that name's dead letters at once. A user's processor (``--processor``) is one
sink that takes every outcome, whatever its target.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tickwheel.dispatch import ProcessingResult, TaskProcessor
from tickwheel.pipeline.contract.events import TARGET_NAME
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.delivery.batch_delivery import DEFAULT_ROUTE, OTHER_TARGETS
from tickwheel.pipeline.delivery.sink import Delivery, OutcomeSink, deliver_outcomes
from tickwheel.pipeline.io.files import write_bytes_atomically
from tickwheel.pipeline.io.outputs import DEAD_LETTERS
from tickwheel.service.targets import DEFAULT_TARGET, TargetSpec
from tickwheel.service.webhook import WebhookProcessor, WebhookStats, outcomes_body

__all__ = ["Outbox", "UnknownTargets"]

log = logging.getLogger(__name__)

_WORKERS = 4


class UnknownTargets:
    """The processor of outcomes that name a target no target has: each request goes
    to that name's dead letters, so that ``tickwheel redeliver`` sends it once the
    target is defined."""

    def __init__(self, dead_letters: Path) -> None:
        self.dead_letters = dead_letters
        self.count = 0
        self._lock = threading.Lock()

    def process(self, task: OutcomeRow) -> ProcessingResult:
        return self.process_batch([task])

    def process_batch(self, tasks: list[OutcomeRow]) -> ProcessingResult:
        by_target: dict[str, list[OutcomeRow]] = {}
        for row in tasks:
            name = row.target or DEFAULT_TARGET
            if TARGET_NAME.fullmatch(name) is None:  # the contract refuses such rows
                name = "_unnamed"
            by_target.setdefault(name, []).append(row)
        for target, rows in by_target.items():
            where = self.dead_letters / target
            where.mkdir(parents=True, exist_ok=True)
            record = {"target": target, "url": None, "status": None,
                      "answer": f"no target {target!r} is defined", "attempts": 0,
                      "webhook_id": None,
                      "request": json.loads(outcomes_body(rows))}
            name = f"{time.time_ns()}-{threading.get_ident()}.json"
            write_bytes_atomically(json.dumps(record, ensure_ascii=False).encode(),
                                   where / name)
            log.warning("%d outcomes name the target %r, which is not defined: written "
                        "to %s", len(rows), target, where / name)
        with self._lock:
            self.count += len(tasks)
        return ProcessingResult.PERMANENT_ERROR


class Outbox:
    """The sinks of a run, by route (a target's name, ``default`` for outcomes naming
    none, ``*`` for those naming an unknown target), or one sink for a user's processor.
    Make one with :meth:`for_targets` or :meth:`for_processor`; give :attr:`sink` to an
    engine; :meth:`close` at the end."""

    def __init__(self, routes: Mapping[str, TaskProcessor[OutcomeRow]], *,
                 webhooks: Mapping[str, WebhookProcessor] | None = None,
                 takes_all: bool = False) -> None:
        self.processors = dict(routes)
        self.webhooks = dict(webhooks or {})
        self.takes_all = takes_all
        self.sinks: dict[str, OutcomeSink] = {
            name: _sink(name, processor, self.webhooks.get(name))
            for name, processor in self.processors.items()}

    @classmethod
    def for_targets(cls, targets: Mapping[str, TargetSpec], output: Path) -> Outbox:
        """A webhook per target, its dead letters in ``output/dead-letter/<name>/``,
        and those of targets not defined there too."""
        root = output / DEAD_LETTERS
        webhooks = {name: WebhookProcessor(spec, root / name)
                    for name, spec in targets.items()}
        routes: dict[str, TaskProcessor[OutcomeRow]] = dict(webhooks)
        routes[OTHER_TARGETS] = UnknownTargets(root)
        return cls(routes, webhooks=webhooks)

    @classmethod
    def for_processor(cls, processor: TaskProcessor[OutcomeRow]) -> Outbox:
        return cls({DEFAULT_ROUTE: processor}, takes_all=True)

    @property
    def targets(self) -> frozenset[str]:
        """The targets a row may name."""
        return frozenset(self.webhooks)

    @property
    def sink(self) -> OutcomeSink | dict[str, OutcomeSink]:
        """What an engine takes as its ``sink``."""
        return self.sinks[DEFAULT_ROUTE] if self.takes_all else dict(self.sinks)

    def stats(self) -> dict[str, WebhookStats]:
        """Each target's counts: outcomes delivered, failed, retried and dead-lettered."""
        return {name: webhook.stats() for name, webhook in sorted(self.webhooks.items())}

    def status(self) -> dict[str, Any]:
        """Each target's counts, for ``/v1/status`` and the console."""
        targets: dict[str, Any] = {}
        for name, webhook in sorted(self.webhooks.items()):
            targets[name] = {**asdict(webhook.stats()), "urls": list(webhook.target.urls),
                             "url": webhook.url, "strategy": webhook.target.strategy,
                             "signed": webhook.target.signing_key is not None,
                             "dead_letter_dir": str(webhook.dead_letters)}
        unknown = self.processors.get(OTHER_TARGETS)
        body: dict[str, Any] = {"targets": targets}
        if isinstance(unknown, UnknownTargets):
            body["unknown_target_outcomes"] = unknown.count
        return body

    def deliver(self, outcomes: Iterable[OutcomeRow], timeout_s: float = 60.0,
                ) -> dict[str, Delivery]:
        """A batch run's delivery: each route's outcomes to its processor, the routes
        at once."""
        if self.takes_all:
            (processor,) = self.processors.values()
            return {DEFAULT_ROUTE: deliver_outcomes(outcomes, processor, timeout_s=timeout_s)}
        by_route: dict[str, list[OutcomeRow]] = {name: [] for name in self.processors}
        for row in outcomes:
            route = (DEFAULT_ROUTE if row.target is None
                     else row.target if row.target in self.webhooks else OTHER_TARGETS)
            if route in by_route:
                by_route[route].append(row)
        busy = {name: rows for name, rows in by_route.items() if rows}
        with ThreadPoolExecutor(max(1, len(busy))) as pool:
            futures = {name: pool.submit(
                deliver_outcomes, rows, self.processors[name], name=name,
                max_batch_size=_batch(self.webhooks.get(name)),
                max_buffer_size=_buffer(self.webhooks.get(name)), timeout_s=timeout_s,
                congestion_retry_delay_ms=_retry_ms(self.webhooks.get(name)),
                network_failure_retry_ms=_retry_ms(self.webhooks.get(name)))
                for name, rows in busy.items()}
            return {name: future.result() for name, future in futures.items()}

    def close(self, timeout_s: float = 60.0) -> dict[str, Delivery]:
        """Close every sink (one deadline for all) and every webhook's connections."""
        deadline = time.monotonic() + timeout_s
        closed = {name: sink.close(max(0.0, deadline - time.monotonic()))
                  for name, sink in self.sinks.items()}
        for webhook in self.webhooks.values():
            webhook.close()
        return closed


def _batch(webhook: WebhookProcessor | None) -> int:
    return 250 if webhook is None else webhook.target.max_batch


def _buffer(webhook: WebhookProcessor | None) -> int:
    # OutcomeSink wants room for every batch in flight to come back after congestion.
    return max(10_000, 2 * (_WORKERS * _batch(webhook) + 64))


def _retry_ms(webhook: WebhookProcessor | None) -> int:
    return 1_000 if webhook is None else webhook.target.retry_ms


def _sink(name: str, processor: TaskProcessor[OutcomeRow],
          webhook: WebhookProcessor | None) -> OutcomeSink:
    return OutcomeSink(processor, name=f"outcomes-{name}", max_batch_size=_batch(webhook),
                       max_buffer_size=_buffer(webhook), worker_count=_WORKERS,
                       congestion_retry_delay_ms=_retry_ms(webhook),
                       network_failure_retry_ms=_retry_ms(webhook))
