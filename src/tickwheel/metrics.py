"""One Prometheus collector over the ``stats()`` snapshots of timers, purgatories,
dispatchers and asyncio loops' wheels (``pip install tickwheel[metrics]``).

    from prometheus_client import REGISTRY, start_http_server
    from tickwheel.metrics import TickwheelCollector

    collector = TickwheelCollector().add_timer("requests", timer).add_purgatory(purgatory)
    REGISTRY.register(collector)
    start_http_server(9100)

Names are ``tickwheel_<component>_<what>``, labelled by the component's name; counters
end in ``_total``; lateness, batch sizes and waits are histograms in milliseconds.
A second component under a name already exported is refused (``name=`` relabels one).
Every scrape reads fresh snapshots: nothing is cached or sampled in between.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from typing import Any, Protocol

try:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "tickwheel.metrics needs prometheus_client: pip install 'tickwheel[metrics]'"
    ) from exc

from tickwheel._histogram import HistogramSnapshot
from tickwheel.aio import WheelScheduler, scheduler_for
from tickwheel.dispatch import TaskDispatcher
from tickwheel.purgatory import Purgatory
from tickwheel.timers import TimerBase

__all__ = ["PipelineCounts", "StatsSource", "TickwheelCollector"]


class StatsSource(Protocol):
    """A component whose ``stats()`` is a dataclass snapshot of counts."""

    def stats(self) -> Any: ...


class PipelineCounts(Protocol):
    """What a pipeline run's result gives the metrics: the reference engine's
    :class:`~tickwheel.pipeline.engines.reference.RunResult` or the Spark engine's result."""

    @property
    def rows_in(self) -> int: ...
    @property
    def rows_applied(self) -> int: ...
    @property
    def ignored_cancels(self) -> int: ...
    @property
    def pending(self) -> int: ...
    def quarantined_by_reason(self) -> dict[str, int]: ...
    def outcomes_by_outcome(self) -> dict[str, int]: ...


def _buckets(snapshot: HistogramSnapshot) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    running = 0
    for bound, n in zip(snapshot.bounds, snapshot.counts, strict=False):
        running += n
        out.append((str(bound), float(running)))
    out.append(("+Inf", float(snapshot.count)))
    return out


class _Families:
    """Metric families of one kind of component, filled one component at a time."""

    def __init__(self, prefix: str, label: str, counters: Iterable[tuple[str, str]],
                 gauges: Iterable[tuple[str, str]],
                 histograms: Iterable[tuple[str, str]]) -> None:
        self.label = label
        self.counters = {n: CounterMetricFamily(f"{prefix}_{n}", h, labels=[label])
                         for n, h in counters}
        self.gauges = {n: GaugeMetricFamily(f"{prefix}_{n}", h, labels=[label])
                       for n, h in gauges}
        self.histograms = {n: HistogramMetricFamily(f"{prefix}_{n}", h, labels=[label])
                           for n, h in histograms}

    def add(self, name: str, values: dict[str, Any]) -> None:
        for n, family in self.counters.items():
            family.add_metric([name], float(values[n]))
        for n, gauge in self.gauges.items():
            if n in values:  # some gauges only some components have
                gauge.add_metric([name], float(values[n]))
        for n, histogram in self.histograms.items():
            snap: HistogramSnapshot = values[n]
            histogram.add_metric([name], _buckets(snap), float(snap.total))

    def all(self) -> Iterator[Metric]:
        yield from self.counters.values()
        yield from self.gauges.values()
        yield from self.histograms.values()


def _add(components: dict[str, Any], kind: str, name: str, component: object) -> None:
    """Two components under one label would be one series that jumps between them."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a {kind}'s metrics name must be a non-empty str, got {name!r}")
    held = components.get(name)
    if held is not None and held is not component:
        raise ValueError(f"a {kind} named {name!r} is already exported; give this one "
                         "another name")
    components[name] = component


class TickwheelCollector(Collector):
    """Register it with a ``prometheus_client`` registry; add components to it."""

    def __init__(self) -> None:
        self._timers: dict[str, TimerBase] = {}
        self._purgatories: dict[str, Purgatory] = {}
        self._dispatchers: dict[str, TaskDispatcher[Any]] = {}
        self._pipelines: dict[str, PipelineCounts | Callable[[], PipelineCounts]] = {}
        self._loops: dict[str, WheelScheduler] = {}
        self._webhooks: dict[str, StatsSource] = {}
        self._intakes: dict[str, StatsSource] = {}

    def add_timer(self, name: str, timer: TimerBase) -> TickwheelCollector:
        _add(self._timers, "timer", name, timer)
        return self

    def add_purgatory(self, purgatory: Purgatory, name: str | None = None,
                      ) -> TickwheelCollector:
        """Labelled with the purgatory's own name unless ``name`` is given (two
        purgatories of one name, such as two coordinators' "Heartbeat", need one)."""
        _add(self._purgatories, "purgatory", purgatory.name if name is None else name,
             purgatory)
        return self

    def add_dispatcher(self, dispatcher: TaskDispatcher[Any], name: str | None = None,
                       ) -> TickwheelCollector:
        """Labelled with the dispatcher's own name unless ``name`` is given."""
        _add(self._dispatchers, "dispatcher", dispatcher.name if name is None else name,
             dispatcher)
        return self

    def add_event_loop(self, name: str, loop: asyncio.AbstractEventLoop,
                       ) -> TickwheelCollector:
        """The wheel of an asyncio loop: a ``tickwheel.aio`` loop's own, or the one
        ``tickwheel.aio.timeout`` uses on any other loop."""
        _add(self._loops, "event loop", name, scheduler_for(loop))
        return self

    def add_pipeline_run(self, name: str,
                         result: PipelineCounts | Callable[[], PipelineCounts],
                         ) -> TickwheelCollector:
        """A pipeline run's counts, of either engine (the latest result registered
        under ``name``): a result, or a function that gives the latest counts at each
        scrape (a following engine's)."""
        self._pipelines[name] = result
        return self

    def add_webhook(self, name: str, webhook: StatsSource) -> TickwheelCollector:
        """A ``WebhookProcessor`` (a target of ``--targets``, or ``--deliver-to``'s
        ``default``), labelled ``target``: outcomes delivered, failed, retried and
        dead-lettered, requests by verdict, and the delivery lag."""
        _add(self._webhooks, "webhook", name, webhook)
        return self

    def add_intake(self, name: str, server: StatsSource) -> TickwheelCollector:
        """A ``SubmitServer`` (``--listen``): requests, rows acknowledged, refusals,
        and how far the engine is behind what was acknowledged."""
        _add(self._intakes, "intake", name, server)
        return self

    def collect(self) -> Iterator[Metric]:
        timers = _Families(
            "tickwheel_timer", "timer",
            [("scheduled", "Tasks added"), ("expired", "Tasks that ran"),
             ("cancelled", "Tasks cancelled while pending"),
             ("errors", "Tasks whose run() raised")],
            [("pending", "Tasks pending")],
            [("lateness_ms", "Milliseconds from a task's expiration to its dispatch")])
        for name, timer in self._timers.items():
            s = timer.stats()
            timers.add(name, {"scheduled": s.scheduled, "expired": s.expired,
                              "cancelled": s.cancelled, "errors": s.errors,
                              "pending": s.pending, "lateness_ms": s.lateness_ms})
        yield from timers.all()

        purgatories = _Families(
            "tickwheel_purgatory", "purgatory",
            [("completed", "Operations completed early"),
             ("expired", "Operations that reached their deadline"),
             ("cancelled", "Operations cancelled"), ("purges", "Purge runs"),
             ("purged", "Watcher entries removed by purges"),
             ("errors", "Operations whose completion raised")],
            [("delayed", "Operations in the timer"), ("watched", "Watcher entries"),
             ("keys", "Keys with watchers")],
            [("expiry_lateness_ms", "Milliseconds from a deadline to the expiry")])
        for name, purgatory in self._purgatories.items():
            p = purgatory.stats()
            purgatories.add(name, {
                "completed": p.completed, "expired": p.expired, "cancelled": p.cancelled,
                "purges": p.purges, "purged": p.purged, "errors": p.errors,
                "delayed": p.num_delayed, "watched": p.watched, "keys": p.num_keys,
                "expiry_lateness_ms": p.expiry_lateness_ms})
        yield from purgatories.all()

        dispatchers = _Families(
            "tickwheel_dispatcher", "dispatcher",
            [("accepted", "Tasks accepted"), ("replayed", "Tasks handed back for a retry"),
             ("expired", "Tasks dropped at their expiry"),
             ("overridden", "Tasks replaced by a newer task with the same id"),
             ("queue_overflows", "Tasks dropped because the buffer was full"),
             ("dropped", "Tasks dropped after a permanent error"),
             ("processor_errors", "Processor calls that raised"),
             ("abandoned", "Tasks still queued when close() gave up"),
             ("late", "Tasks whose processor returned after close()")],
            [("acceptor_queue", "Tasks in the acceptor queue"),
             ("reprocess_queue", "Tasks waiting for a retry"),
             ("pending", "Tasks pending in the buffer"),
             ("in_flight", "Tasks inside the processor")],
            [("batch_size", "Tasks per batch handed to a worker"),
             ("wait_ms", "Milliseconds from acceptance to hand-over")])
        executions = CounterMetricFamily("tickwheel_dispatcher_executions",
                                         "Processor calls by result",
                                         labels=["dispatcher", "result"])
        tasks = CounterMetricFamily("tickwheel_dispatcher_tasks",
                                    "Tasks by the result of the call that carried them",
                                    labels=["dispatcher", "result"])
        for name, dispatcher in self._dispatchers.items():
            d = dispatcher.stats()
            dispatchers.add(name, {
                "accepted": d.accepted, "replayed": d.replayed, "expired": d.expired,
                "overridden": d.overridden, "queue_overflows": d.queue_overflows,
                "dropped": d.dropped, "processor_errors": d.processor_errors,
                "acceptor_queue": d.acceptor_queue, "reprocess_queue": d.reprocess_queue,
                "pending": d.pending, "abandoned": d.abandoned, "late": d.late,
                "in_flight": d.in_flight, "batch_size": d.batch_size, "wait_ms": d.wait_ms})
            for result, n in d.batches.items():
                executions.add_metric([name, result], float(n))
            for result, n in d.tasks.items():
                tasks.add_metric([name, result], float(n))
        yield from dispatchers.all()
        yield executions
        yield tasks
        yield from self._collect_loops()
        yield from self._collect_pipelines()
        yield from self._collect_service()

    def _collect_loops(self) -> Iterator[Metric]:
        loops = _Families(
            "tickwheel_aio", "loop",
            [("scheduled", "Handles scheduled"), ("expired", "Handles taken out to run"),
             ("cancelled", "Handles cancelled while pending"),
             ("arms", "Times the loop's own timer was armed at the wheel's next bucket"),
             ("fires", "Times that timer fired")],
            [("pending", "Handles pending")],
            [("lateness_ms", "Milliseconds from a handle's due millisecond to its run")])
        for name, scheduler in self._loops.items():
            s = scheduler.stats()
            loops.add(name, {"scheduled": s.scheduled, "expired": s.expired,
                             "cancelled": s.cancelled, "arms": s.arms, "fires": s.fires,
                             "pending": s.pending, "lateness_ms": s.lateness_ms})
        yield from loops.all()

    def _collect_service(self) -> Iterator[Metric]:
        webhooks = _Families(
            "tickwheel_webhook", "target",
            [("delivered", "Outcomes the receiver took (2xx)"),
             ("congested", "Requests answered 503 or 429, or not in time: backed off"),
             ("transient", "Requests that failed otherwise (5xx, no connection): retried"),
             ("failed", "Outcomes in requests that failed (any answer but 2xx, or none)"),
             ("retried", "Outcomes in failed requests that are tried again"),
             ("dead_letters", "Outcomes written to the target's dead letters "
                              "(refused, or max_attempts reached)")],
            [("lag_ms", "At the last delivery, wall ms since its oldest outcome resolved")],
            [])
        for name, webhook in self._webhooks.items():
            webhooks.add(name, {k: v for k, v in asdict(webhook.stats()).items()
                                if v is not None})
        yield from webhooks.all()
        intakes = _Families(
            "tickwheel_intake", "intake",
            [("requests", "Requests to POST /v1/events"),
             ("accepted_rows", "Rows acknowledged: on disk in the input directory"),
             ("commits", "Group commits: files landed"),
             ("replayed", "Requests answered again for their idempotency key"),
             ("refused_bad", "Requests refused with 400 or 422"),
             ("refused_busy", "Requests refused with 503 (engine behind, disk full)"),
             ("refused_too_large", "Requests refused with 413"),
             ("refused_unauthorized", "Requests refused with 401: no token, or a wrong one"),
             ("retired_files", "Input files deleted once the engine committed them"),
             ("refused_connections", "Connections answered 503 at once: over the limit"),
             ("timed_out_connections", "Connections closed: no request head in time")],
            [("backlog_rows", "Rows acknowledged that the engine has not read yet"),
             ("keys", "Idempotency keys held"),
             ("unretired_files", "Input files landed and not yet retired"),
             ("writing_requests", "Requests stamped and not yet landed or refused"),
             ("floor_lag_ms", "How far the time floor, which holds the engine's clock, "
                              "stands behind the wall clock"),
             ("connections", "Connections open to the submit API")],
            [("ack_ms", "Milliseconds from a request's arrival to its acknowledgement"),
             ("commit_wait_ms", "Milliseconds a request waited for its group commit"),
             ("land_ms", "Milliseconds a group commit took to land its file")])
        for name, server in self._intakes.items():
            intake = server.stats()
            intakes.add(name, {f: getattr(intake, f) for f in intake.__dataclass_fields__})
        yield from intakes.all()

    def _collect_pipelines(self) -> Iterator[Metric]:
        rows = _Families(
            "tickwheel_pipeline", "pipeline",
            [("rows_in", "Rows read"), ("rows_applied", "Rows applied"),
             ("ignored_cancels", "Cancels of unknown or resolved operations"),
             ("skipped", "Occurrences of recurring schedules passed over by their "
                         "misfire policy")],
            [("pending", "Operations still pending (at the end of the input, for a batch "
                          "run)"),
             ("schedules", "Recurring schedules held"),
             ("held", "Rows read but not applied yet (time has not passed them)"),
             ("batches", "Batches run (follow mode)"),
             ("lag_ms", "How far time stands behind the wall clock (follow mode)"),
             ("state_bytes", "Bytes of state saved at the last batch"),
             ("files_skipped", "Input files the last listing skipped: a name that is not "
                               "UTF-8, a symlink out of the input directory or to nothing"),
             ("files_changed", "Input files that changed after they were read (follow "
                               "mode): rows written since are not read"),
             ("delivery_behind_batches", "Batches whose outcomes are written and not yet "
                                         "settled by the webhook or processor"),
             ("delivery_lag_ms", "Age in milliseconds of the oldest batch the webhook or "
                                 "processor has not settled")],
            [])
        quarantined = CounterMetricFamily("tickwheel_pipeline_quarantined",
                                          "Rows quarantined, by reason",
                                          labels=["pipeline", "reason"])
        outcomes = CounterMetricFamily("tickwheel_pipeline_outcomes",
                                       "Operations resolved, by outcome",
                                       labels=["pipeline", "outcome"])
        for name, source in self._pipelines.items():
            r = source() if callable(source) else source
            held: int = getattr(r, "held", 0)  # the Spark engine's; the reference holds none
            values = {"rows_in": r.rows_in, "rows_applied": r.rows_applied,
                      "ignored_cancels": r.ignored_cancels, "pending": r.pending,
                      "held": held, "skipped": getattr(r, "skipped", 0)}
            # Where the result has them.
            for gauge in ("batches", "lag_ms", "state_bytes", "files_skipped",
                          "files_changed", "schedules", "delivery_behind_batches",
                          "delivery_lag_ms"):
                value = getattr(r, gauge, None)
                if value is not None:
                    values[gauge] = value
            rows.add(name, values)
            for reason, n in r.quarantined_by_reason().items():
                quarantined.add_metric([name, reason], float(n))
            for outcome, n in r.outcomes_by_outcome().items():
                outcomes.add_metric([name, outcome], float(n))
        yield from rows.all()
        yield quarantined
        yield outcomes
