"""The Service object: a service started in-process, with its intake, engine, delivery
and metrics started and stopped together."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import eventually
from tickwheel.dispatch import ProcessingResult
from tickwheel.pipeline import LocalFollowEngine, OutcomeRow, wall_clock_ms
from tickwheel.pipeline.engines.following import FollowResult
from tickwheel.service.app import ListenError, ListenOptions, Service, ServiceOptions
from tickwheel.service.outbox import Outbox

pytest.importorskip("aiohttp")


class Recorder:
    """A processor that keeps every outcome it is given."""

    def __init__(self) -> None:
        self.outcomes: list[OutcomeRow] = []
        self._lock = threading.Lock()

    def process(self, task: OutcomeRow) -> ProcessingResult:
        return self.process_batch([task])

    def process_batch(self, tasks: list[OutcomeRow]) -> ProcessingResult:
        with self._lock:
            self.outcomes.extend(tasks)
        return ProcessingResult.SUCCESS

    def ids(self) -> list[str]:
        with self._lock:
            return [row.op_id for row in self.outcomes]


def _engine(data: Path, service: Service) -> LocalFollowEngine:
    return LocalFollowEngine(data / "input", data / "outputs", clock=wall_clock_ms,
                             lateness_ms=100, feed=service.feed, sink=service.sink,
                             on_commit=service.on_commit)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    (tmp_path / "input").mkdir()
    return tmp_path


def _options(**kwargs: object) -> ServiceOptions:
    return ServiceOptions(listen=ListenOptions(port=0), trigger_ms=50, **kwargs)  # type: ignore[arg-type]


class Running:
    """A service following in a thread of its own until :meth:`stop`."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.stop_event = threading.Event()
        self.result: list[FollowResult] = []
        self.thread = threading.Thread(
            target=lambda: self.result.append(service.follow(self.stop_event)))
        self.thread.start()

    def stop(self) -> FollowResult:
        self.stop_event.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        return self.result[0]


@pytest.fixture
def running(data: Path) -> Iterator[tuple[Service, Recorder, LocalFollowEngine]]:
    recorder = Recorder()
    with Service(_options(), data / "state", outbox=Outbox.for_processor(recorder)) as service:
        engine = _engine(data, service)
        service.start(engine)
        yield service, recorder, engine
    engine.close()


def test_a_service_takes_a_row_over_http_and_delivers_its_outcome(
        running: tuple[Service, Recorder, LocalFollowEngine]) -> None:
    service, recorder, _ = running
    assert service.url is not None and not service.ready
    follow = Running(service)
    now = wall_clock_ms()
    answer = httpx.post(f"{service.url}/v1/events", json={
        "type": "watch", "op_id": "order-1", "condition": "none", "keys": [],
        "deadline_ms": now + 200})
    assert answer.status_code == 200
    assert eventually(lambda: recorder.ids() == ["order-1"], 60)
    assert service.ready
    status = httpx.get(f"{service.url}/v1/status").json()
    assert status["ready"] is True and status["engine"]["rows_in"] == 1
    assert status["engine"]["lag_ms"] is not None  # on the wall clock, measured now
    result = follow.stop()
    assert (result.rows_in, result.outcomes) == (1, 1)
    with pytest.raises(httpx.ConnectError):  # the API stops with the engine
        httpx.get(f"{service.url}/v1/status", timeout=5)
    deliveries = service.close()
    assert sum(d.stats.tasks.get("success", 0) for d in deliveries.values()) == 1
    assert service.close() is deliveries  # once only


def test_the_engine_made_from_the_services_parts_shares_its_feed_and_view(
        running: tuple[Service, Recorder, LocalFollowEngine]) -> None:
    service, _, engine = running
    assert service.feed is not None and engine.feed is service.feed
    assert service.view is not None and engine.on_commit == service.view.apply
    with pytest.raises(RuntimeError, match="already"):
        service.start(engine)


def test_a_service_joins_the_metrics_registry_and_leaves_it_when_closed(
        data: Path) -> None:
    prometheus = pytest.importorskip("prometheus_client")
    with Service(_options(), data / "state") as service:
        engine = _engine(data, service)
        service.start(engine)
        text = httpx.get(f"{service.url}/metrics").text
        assert 'tickwheel_pipeline_rows_in_total{pipeline="follow"}' in text
    engine.close()
    assert "tickwheel_pipeline_rows_in_total" not in prometheus.generate_latest(
        prometheus.REGISTRY).decode()


def test_an_address_in_use_is_a_service_error_before_any_batch(data: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        options = ServiceOptions(listen=ListenOptions(port=port))
        with Service(options, data / "state") as service:
            engine = _engine(data, service)
            with pytest.raises(ListenError, match="cannot serve there"):
                service.start(engine)
            assert not service.ready
        engine.close()


def test_follow_before_start_is_refused(data: Path) -> None:
    with Service(_options(), data / "state") as service, \
            pytest.raises(RuntimeError, match="start"):
        service.follow(threading.Event())


def test_a_service_without_an_address_has_no_feed_and_follows_alone(data: Path) -> None:
    recorder = Recorder()
    with Service(ServiceOptions(trigger_ms=50), data / "state",
                 outbox=Outbox.for_processor(recorder)) as service:
        assert service.feed is None and service.view is None
        engine = _engine(data, service)
        service.start(engine)
        assert service.url is None
        now = wall_clock_ms()
        (data / "input" / "a.jsonl").write_text(json.dumps(
            {"ts_ms": now, "type": "watch", "op_id": "a", "condition": "none", "keys": [],
             "deadline_ms": now + 100}) + "\n")
        follow = Running(service)
        assert eventually(lambda: recorder.ids() == ["a"], 60)
        assert follow.stop().outcomes == 1
    engine.close()


def test_a_service_follows_once_and_refuses_a_second_follow_during_or_after_it(
        running: tuple[Service, Recorder, LocalFollowEngine]) -> None:
    service = running[0]
    first = Running(service)
    assert eventually(lambda: service.ready, 60)
    with pytest.raises(RuntimeError, match="follows once"):
        service.follow(threading.Event())
    first.stop()
    with pytest.raises(RuntimeError, match="follows once"):
        service.follow(threading.Event())


def test_a_closed_service_takes_no_engine(data: Path) -> None:
    service = Service(_options(), data / "state")
    service.close()
    engine = _engine(data, service)
    with pytest.raises(RuntimeError, match="closed"):
        service.start(engine)
    with pytest.raises(RuntimeError, match="start"):
        service.follow(threading.Event())
    engine.close()
