"""Service: the scheduler service as one object, owning its intake, its engine's
lifecycle, delivery and metrics, as aiohttp's ``Application`` owns its parts.

A service is made first, then the engine from its parts (so that nothing is set on
the engine after it is made), then it runs::

    with Service(ServiceOptions(listen=ListenOptions(port=8470)), state_dir,
                 outbox=outbox) as service:
        engine = LocalFollowEngine(input_dir, output_dir, clock=wall_clock_ms,
                                   feed=service.feed, sink=service.sink,
                                   on_commit=service.on_commit)
        service.start(engine)       # the API listens from here on
        result = service.follow(stop)  # the engine's batches, until stop is set
    service.deliveries              # what each target settled, once closed

The engine is either :class:`~tickwheel.pipeline.engines.follow.LocalFollowEngine` or
:class:`~tickwheel.pipeline.spark.SparkEngine` (with ``floor_file=True``: its input
source reads the time floor from a file), through the
:class:`~tickwheel.pipeline.engines.following.FollowingEngine` protocol.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tickwheel.pipeline.contract.limits import DEFAULT_STOP_TIMEOUT_MS, DEFAULT_TRIGGER_MS
from tickwheel.pipeline.delivery.sink import Delivery, OutcomeSink
from tickwheel.pipeline.engines.feed import IntakeFeed
from tickwheel.pipeline.engines.following import (
    FollowBatch,
    FollowingEngine,
    FollowResult,
    live_counts,
    wall_clock_ms,
)
from tickwheel.pipeline.io.outputs import OutputDirError, recent_outcomes
from tickwheel.pipeline.semantics.partition import CommittedChanges
from tickwheel.service.connections import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS
from tickwheel.service.server import FLOOR_FILE, SubmitServer
from tickwheel.service.view import MAX_RESOLVED, StateView

if TYPE_CHECKING:
    from tickwheel.metrics import TickwheelCollector
    from tickwheel.service.outbox import Outbox

__all__ = ["ListenError", "ListenOptions", "Service", "ServiceError", "ServiceOptions"]

log = logging.getLogger(__name__)


class ServiceError(Exception):
    """The service cannot start: its intake's state cannot be read, or its address
    cannot be served (:class:`ListenError`). No batch has run."""


class ListenError(ServiceError):
    """The API's address cannot be served: in use, or not this machine's."""


@dataclass(frozen=True, slots=True)
class ListenOptions:
    """Where the API listens, and what its clients may hold."""

    host: str = "127.0.0.1"
    port: int = 0
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    token: str | None = None  # every request must carry it, if set


@dataclass(frozen=True, slots=True)
class ServiceOptions:
    """How a service runs: ``listen`` (None: no API, the engine follows its input
    directory alone), its engine's trigger and stop timeout, and whether its counts
    join the process's Prometheus registry (``metrics``; they do whenever it listens
    and the metrics extra is installed)."""

    listen: ListenOptions | None = None
    trigger_ms: int = DEFAULT_TRIGGER_MS
    stop_timeout_ms: int = DEFAULT_STOP_TIMEOUT_MS
    metrics: bool = False


class Service:
    """The intake (:class:`~tickwheel.service.server.SubmitServer`, with its
    :class:`~tickwheel.pipeline.engines.feed.IntakeFeed` and the read API's
    :class:`~tickwheel.service.view.StateView`), a following engine, the
    :class:`~tickwheel.service.outbox.Outbox` its outcomes go to, and the metrics export,
    started and stopped together. ``state_dir`` holds the intake's idempotency keys
    (``CHECKPOINT/submit``, by convention)."""

    def __init__(self, options: ServiceOptions, state_dir: Path, *,
                 outbox: Outbox | None = None, floor_file: bool = False) -> None:
        self.options = options
        self.state_dir = state_dir
        self.outbox = outbox
        listening = options.listen is not None
        #: What the engine shares with the intake: give it as the engine's ``feed``.
        self.feed: IntakeFeed | None = None if not listening else IntakeFeed(
            wall_clock_ms, floor_file=state_dir / FLOOR_FILE if floor_file else None)
        #: What the read API answers from: its ``apply`` is the engine's ``on_commit``.
        self.view: StateView | None = StateView() if listening else None
        self.engine: FollowingEngine | None = None
        self.server: SubmitServer | None = None
        #: What each route settled: set by :meth:`close`.
        self.deliveries: Mapping[str, Delivery] = {}
        self._ran = threading.Event()  # set once the engine has run a batch
        self._collector: TickwheelCollector | None = None
        self._closed = False
        self._followed = False
        self._lifecycle = threading.Lock()  # follow() once, and not after close()

    # -- the engine's parts -----------------------------------------------------------

    @property
    def sink(self) -> OutcomeSink | dict[str, OutcomeSink] | None:
        """The engine's ``sink``: the outbox's, if there is one."""
        return None if self.outbox is None else self.outbox.sink

    @property
    def on_commit(self) -> Callable[[CommittedChanges], object] | None:
        """The engine's ``on_commit``: the read view follows its commits."""
        return None if self.view is None else self.view.apply

    @property
    def ready(self) -> bool:
        """Whether the engine has run a batch (the Spark engine takes tens of seconds
        to start, while the API already acknowledges rows)."""
        return self._ran.is_set()

    @property
    def url(self) -> str | None:
        """The API's base URL once started (its port, where the options named 0)."""
        return None if self.server is None else self.server.url

    # -- the lifecycle ----------------------------------------------------------------

    def start(self, engine: FollowingEngine) -> None:
        """Take ``engine`` (made from this service's parts), read back the outcomes a
        restart would otherwise forget, join the metrics, and start the API; returns
        once it listens (:class:`ServiceError` if it cannot)."""
        with self._lifecycle:
            if self._closed:
                raise RuntimeError("the service is closed")
            if self.engine is not None:
                raise RuntimeError("the service has an engine already")
            self.engine = engine
        counts = engine.counts()
        if self.view is not None:
            self._remember_outcomes(engine, counts.release_ms)
        self._collector = self._register_metrics(engine)
        listen = self.options.listen
        if listen is None:
            return
        try:
            server = SubmitServer(
                engine.input_dir, self.state_dir, host=listen.host, port=listen.port,
                max_connections=listen.max_connections, token=listen.token,
                header_timeout_s=listen.header_timeout_s, feed=self.feed,
                engine=engine, metrics=_metrics_text(),
                # One client's row may not move everyone's time: ahead by at most the
                # lateness.
                max_future_ms=None if engine.clock is None else engine.lateness_ms,
                min_stamp_ms=counts.release_ms or 0, ready=self._ran.is_set,
                view=self.view,
                delivery=None if self.outbox is None else self.outbox.status,
                # A row may name only a target that delivers it.
                targets=(None if self.outbox is None or self.outbox.takes_all
                         else self.outbox.targets))
        except (OSError, ValueError) as exc:  # its keys or input files, as found
            raise ServiceError(f"the submit API's state in {self.state_dir}: {exc}") from exc
        try:
            server.start()
        except OSError as exc:
            raise ListenError(f"cannot serve there: {exc.strerror or exc}") from exc
        self.server = server
        if self._collector is not None:
            self._collector.add_intake("submit", server)
        log.info("taking rows at %s/v1/events", server.url)

    def follow(self, stop: threading.Event,
               on_batch: Callable[[FollowBatch], None] | None = None) -> FollowResult:
        """Run the engine's batches until ``stop`` is set, each reported to
        ``on_batch``; the API stops with them (what it acknowledged is on disk for the
        next start). A service follows once: its API stops with the engine."""
        with self._lifecycle:
            engine = self.engine
            if engine is None:
                raise RuntimeError("start(engine) first")
            if self._closed:
                raise RuntimeError("the service is closed")
            if self._followed:
                raise RuntimeError("the service has followed already; a service "
                                   "follows once")
            self._followed = True
        ran = self._ran

        def batch_done(batch: FollowBatch) -> None:
            ran.set()
            if on_batch is not None:
                on_batch(batch)

        try:
            return engine.follow(stop, trigger_ms=self.options.trigger_ms,
                                 on_batch=batch_done,
                                 stop_timeout_ms=self.options.stop_timeout_ms)
        finally:
            if self.server is not None:
                self.server.stop()

    def close(self, timeout_s: float = 1.0) -> Mapping[str, Delivery]:
        """Stop delivering (the engine's stop waited for it already: what it holds now
        is delivered at the next start), stop the API if it still runs, and leave the
        metrics registry. Returns what each route settled."""
        with self._lifecycle:
            if self._closed:
                return self.deliveries
            self._closed = True
        if self.server is not None:
            self.server.stop()
        if self.outbox is not None:
            self.deliveries = self.outbox.close(timeout_s=timeout_s)
        if self._collector is not None:
            from prometheus_client import REGISTRY

            REGISTRY.unregister(self._collector)
            self._collector = None
        return self.deliveries

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- its parts ---------------------------------------------------------------------

    def _remember_outcomes(self, engine: FollowingEngine, now_ms: int | None) -> None:
        """The outcomes of the last dedupe retention, read back for the read API
        (operations answer as resolved while their ids are remembered)."""
        retention = engine.dedupe_retention_ms
        if self.view is None or now_ms is None or retention is None:
            return
        try:
            self.view.remember(recent_outcomes(engine.output_dir / "outcomes",
                                               now_ms - retention, MAX_RESOLVED))
        except OutputDirError as exc:  # the view starts without them; the service runs
            log.warning("the read API starts without earlier outcomes: %s", exc)

    def _register_metrics(self, engine: FollowingEngine) -> TickwheelCollector | None:
        """The engine's counts, the outbox's webhooks (and, once it listens, the
        intake's) in the process's Prometheus registry, where the extra is installed."""
        if not self.options.metrics and self.options.listen is None:
            return None
        try:
            from prometheus_client import REGISTRY
        except ImportError:  # without the metrics extra: /metrics answers 404
            return None
        from tickwheel.metrics import TickwheelCollector

        collector = TickwheelCollector().add_pipeline_run("follow",
                                                          lambda: live_counts(engine))
        if self.outbox is not None:
            for target, webhook in self.outbox.webhooks.items():
                collector.add_webhook(target, webhook)
        REGISTRY.register(collector)
        return collector


def _metrics_text() -> Callable[[], tuple[bytes, str]] | None:
    try:
        from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
    except ImportError:
        return None
    return lambda: (generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
