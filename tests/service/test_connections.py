"""What clients can hold of the service: connections are bounded in number and in how
long each may go without a request head; past the bound a client is told to retry."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

pytest.importorskip("aiohttp")

from tests.conftest import eventually
from tests.service.receiver import receiving
from tickwheel.service.connections import ENGINE_DESCRIPTORS, connection_limit
from tickwheel.service.server import SubmitServer

FAR = 99_999_999_999_999


def _closed_by_peer(sock: socket.socket, within_s: float) -> bytes:
    """What the server sent before closing ``sock``; fails if it stays open."""
    sock.settimeout(within_s)
    received = b""
    while True:
        chunk = sock.recv(65_536)
        if not chunk:
            return received
        received += chunk


@pytest.fixture
def small(tmp_path: Path) -> Iterator[SubmitServer]:
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=lambda: 1_000,
                      max_connections=3, header_timeout_s=0.5) as server:
        yield server


def _connect(server: SubmitServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def test_a_connection_beyond_the_limit_is_answered_503_and_closed(tmp_path: Path) -> None:
    with ExitStack() as held:
        small = held.enter_context(SubmitServer(
            tmp_path / "in", tmp_path / "state", clock=lambda: 1_000, max_connections=3))
        for _ in range(3):
            held.enter_context(_connect(small))
        assert eventually(lambda: small.stats().connections == 3, 10)
        with _connect(small) as extra:
            answer = _closed_by_peer(extra, 10)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in answer
        assert small.stats().refused_connections == 1


def test_idle_connections_are_closed_after_the_header_timeout(small: SubmitServer) -> None:
    started = time.monotonic()
    with _connect(small) as idle, _connect(small) as slow:
        slow.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        assert _closed_by_peer(idle, 10) == b""
        assert _closed_by_peer(slow, 10) == b""
        assert time.monotonic() - started >= 0.5
    assert small.stats().timed_out_connections == 2
    # With the idle ones gone, a client gets in again.
    answer = httpx.post(f"{small.url}/v1/events", timeout=10, content=json.dumps(
        {"type": "cancel", "op_id": "a"}))
    assert answer.status_code == 200


def test_a_keep_alive_connection_serves_requests_within_the_timeout(
        small: SubmitServer) -> None:
    with httpx.Client(timeout=10) as client:
        for i in range(3):
            answer = client.post(f"{small.url}/v1/events",
                                 content=json.dumps({"type": "cancel", "op_id": f"a{i}"}))
            assert answer.status_code == 200
            time.sleep(0.2)  # within the timeout of 0.5 s: the same connection
    assert small.stats().timed_out_connections == 0


def test_a_request_in_progress_is_not_cut_by_the_header_timeout(
        tmp_path: Path) -> None:
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=lambda: 1_000,
                      header_timeout_s=0.3, commit_interval_ms=1_000) as server:
        # The group commit waits a second: longer than the header timeout.
        answer = httpx.post(f"{server.url}/v1/events", timeout=10,
                            content=json.dumps({"type": "cancel", "op_id": "a"}))
        assert answer.status_code == 200


def test_the_limit_leaves_the_engine_its_descriptors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (1_024, 4_096))
    assert connection_limit(1_000) == 1_024 - ENGINE_DESCRIPTORS
    assert connection_limit(100) == 100
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (100, 4_096))
    assert connection_limit(512) == 8


@pytest.mark.parametrize(("options", "named"), [
    ({"max_connections": 0}, "max_connections"),
    ({"header_timeout_s": 0.0}, "header_timeout_s"),
    ({"header_timeout_s": float("nan")}, "header_timeout_s"),
])
def test_bad_bounds_are_refused(tmp_path: Path, options: dict[str, float],
                                named: str) -> None:
    with pytest.raises(ValueError, match=named):
        SubmitServer(tmp_path / "in", tmp_path / "state", **options)  # type: ignore[arg-type]


@pytest.mark.slow
def test_idle_connections_past_the_open_file_limit_do_not_stop_the_scheduler(
        tmp_path: Path) -> None:
    """1,100 idle connections to a service under ``ulimit -n 1024``: it refuses those
    past its limit, keeps its checkpoint's descriptors, and fires its deadlines."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1_400:
        pytest.skip("this process may not open 1,100 connections")
    (tmp_path / "in").mkdir()
    with receiving(lambda _n: 200) as receiver:
        child = subprocess.Popen(
            ["bash", "-c", 'ulimit -n 1024 && exec "$@"', "bash",
             sys.executable, "-m", "tickwheel.cli", "run", "--follow", "--clock", "wall",
             "--lateness-ms", "100", "--trigger-ms", "100", "--input", str(tmp_path / "in"),
             "--output", str(tmp_path / "out"), "--listen", "127.0.0.1:0",
             "--header-timeout-ms", "3000", "--deliver-to", receiver.url],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert child.stdout is not None
            port = 0
            for line in child.stdout:
                if "taking rows at" in line:
                    port = int(line.rsplit(":", 1)[1].split("/")[0])
                if line.startswith("following"):
                    break
            assert port
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4_096), hard))
            with ExitStack() as held:
                for _ in range(1_100):
                    try:
                        held.enter_context(socket.create_connection(("127.0.0.1", port),
                                                                    timeout=10))
                    except OSError:  # refused at once: the backlog is full
                        pass
                # While they are held, the engine still reads, resolves and delivers.
                now = time.time_ns() // 1_000_000
                with open(tmp_path / "in" / "dropped.jsonl", "w") as rows:
                    for i in range(5):
                        rows.write(json.dumps({"ts_ms": now, "type": "watch",
                                               "op_id": f"op-{i}", "keys": [],
                                               "condition": "none",
                                               "deadline_ms": now + 500}) + "\n")
                assert eventually(lambda: len(receiver.ids()) == 5, 60,
                                  unless=lambda: child.poll() is not None)
            # The idle ones gone, the API takes rows again.
            answer = httpx.post(f"http://127.0.0.1:{port}/v1/events", timeout=30,
                                content=json.dumps({"type": "cancel", "op_id": "op-0"}))
            assert answer.status_code == 200, answer.text
            status = httpx.get(f"http://127.0.0.1:{port}/v1/status", timeout=30).json()
            assert status["intake"]["refused_connections"] > 0
            assert child.poll() is None
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            child.terminate()
            output, _ = child.communicate(timeout=120)
        assert child.returncode == 0, output
    assert os.path.isdir(tmp_path / "out" / "outcomes")
