"""Outcomes delivered by webhook: Eureka's rules for the answers, dead letters, at least
once through the dispatcher and across kill -9. Loopback only."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import eventually
from tests.service.receiver import receiving
from tickwheel import ProcessingResult
from tickwheel.pipeline.contract.events import OutcomeKind
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.delivery.sink import OutcomeSink
from tickwheel.service import WebhookProcessor, check_webhook_url

ROWS = [OutcomeRow(f"op-{i}", OutcomeKind.EXPIRED, 1_000 + i, 900, ("k",), None)
        for i in range(5)]


@pytest.mark.parametrize(("status", "result"), [
    (200, ProcessingResult.SUCCESS),
    (204, ProcessingResult.SUCCESS),
    (503, ProcessingResult.CONGESTION),
    (429, ProcessingResult.CONGESTION),
    (500, ProcessingResult.TRANSIENT_ERROR),
    (502, ProcessingResult.TRANSIENT_ERROR),
    (404, ProcessingResult.PERMANENT_ERROR),
    (400, ProcessingResult.PERMANENT_ERROR),
])
def test_each_answer_gets_eurekas_verdict(tmp_path: Path, status: int,
                                         result: ProcessingResult) -> None:
    with receiving(lambda _n: status) as receiver:
        webhook = WebhookProcessor(receiver.url, tmp_path / "dead-letter")
        assert webhook.process_batch(ROWS) is result
        webhook.close()
    sent = receiver.requests[0]["outcomes"]
    assert [o["id"] for o in sent] == [f"op:op-{i}@{100 + i}" for i in range(5)]
    assert sent[0] == {"id": "op:op-0@100", "op_id": "op-0", "outcome": "expired",
                       "resolved_ms": 1_000, "latency_ms": 900, "keys": ["k"],
                       "error": None, "skipped": 0, "target": None, "payload": None}
    letters = list((tmp_path / "dead-letter").glob("*.json"))
    if result is ProcessingResult.PERMANENT_ERROR:
        (letter,) = letters
        record = json.loads(letter.read_text())
        assert record["status"] == status and record["answer"] == "no"
        assert len(record["request"]["outcomes"]) == 5
        assert webhook.stats().dead_letters == 5
    else:
        assert letters == []


def test_no_answer_in_time_is_congestion_and_no_connection_is_transient(
        tmp_path: Path) -> None:
    with receiving(lambda _n: 200, delay_s=2.0) as receiver:
        slow = WebhookProcessor(receiver.url, tmp_path, timeout_s=0.2)
        assert slow.process_batch(ROWS) is ProcessingResult.CONGESTION
        slow.close()
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    gone = WebhookProcessor(f"http://127.0.0.1:{port}/hook", tmp_path, timeout_s=5)
    assert gone.process_batch(ROWS) is ProcessingResult.TRANSIENT_ERROR
    assert gone.stats().transient == 1


@pytest.mark.parametrize("url", ["ftp://x/y", "not a url", "http://", "/just/a/path"])
def test_a_bad_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="URL"):
        check_webhook_url(url)


def test_a_receiver_that_answers_503_then_200_gets_every_outcome(tmp_path: Path) -> None:
    rows = [OutcomeRow(f"op-{i}", OutcomeKind.COMPLETED, i, 1, (), None) for i in range(600)]
    with receiving(lambda n: 503 if n < 3 else 200) as receiver:
        webhook = WebhookProcessor(receiver.url, tmp_path)
        with OutcomeSink(webhook, max_batch_size=100, congestion_retry_delay_ms=20) as sink:
            sink.deliver(rows)
            assert sink.flush(timeout_s=60)
        webhook.close()
    assert receiver.ids() == {f"op:op-{i}@{i - 1}" for i in range(600)}
    assert receiver.statuses[:3] == [503, 503, 503]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tickwheel.cli", *args], check=False,
                          capture_output=True, text=True, timeout=300)


def test_a_batch_run_delivers_every_outcome_to_the_webhook(tmp_path: Path) -> None:
    assert _cli("generate", "--events", "3000", "--output", str(tmp_path / "in")
                ).returncode == 0
    with receiving(lambda n: 503 if n == 0 else 200) as receiver:
        done = _cli("run", "--input", str(tmp_path / "in"), "--output",
                    str(tmp_path / "out"), "--deliver-to", receiver.url)
    assert done.returncode == 0, done.stdout + done.stderr
    import pyarrow.parquet as pq

    written = pq.read_table(tmp_path / "out" / "outcomes").to_pylist()
    assert receiver.ids() == {f"op:{r['op_id']}@{r['resolved_ms'] - r['latency_ms']}"
                              for r in written}
    assert f"delivered {len(written):,} outcomes" in done.stdout


def test_refused_options_exit_2_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    bad = _cli("run", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
               "--deliver-to", "ftp://example/x")
    assert bad.returncode == 2 and "--deliver-to" in bad.stdout
    both = _cli("run", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                "--deliver-to", "http://127.0.0.1:9/x", "--processor", "x:y")
    assert both.returncode == 2 and "not both" in both.stdout
    assert not (tmp_path / "out").exists()


def test_delivery_by_webhook_is_at_least_once_across_kill_9(tmp_path: Path) -> None:
    from tickwheel.pipeline.engines.following import wall_clock_ms

    inbox = tmp_path / "in"
    inbox.mkdir()

    def service(url: str) -> subprocess.Popen[str]:
        child = subprocess.Popen(
            [sys.executable, "-m", "tickwheel.cli", "run", "--follow", "--clock", "wall",
             "--lateness-ms", "1000", "--trigger-ms", "50", "--input", str(inbox),
             "--output", str(tmp_path / "out"), "--deliver-to", url],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert child.stdout is not None and "following" in child.stdout.readline()
        return child

    with receiving(lambda _n: 503) as down:  # congested: nothing is settled
        child = service(down.url)
        now = wall_clock_ms()
        lines = [json.dumps({"ts_ms": now, "type": "watch", "op_id": f"op-{i}",
                             "keys": [], "deadline_ms": now, "condition": "none"})
                 for i in range(50)]
        (inbox / ".a.jsonl.tmp").write_text("".join(f"{line}\n" for line in lines))
        (inbox / ".a.jsonl.tmp").rename(inbox / "a.jsonl")
        assert eventually(lambda: len(down.requests) >= 2, 120,
                          unless=lambda: child.poll() is not None)
        child.send_signal(signal.SIGKILL)
        child.wait()
    with receiving(lambda _n: 200) as up:
        child = service(up.url)
        try:
            assert eventually(lambda: len(up.ids()) == 50, 120,
                              unless=lambda: child.poll() is not None)
        finally:
            child.send_signal(signal.SIGTERM)
            output, _ = child.communicate(timeout=60)
    assert child.returncode == 0, output
    assert up.ids() == {f"op:op-{i}@{now}" for i in range(50)}


@pytest.mark.parametrize("status", [200, 404])
def test_a_huge_answer_is_read_no_further_than_a_dead_letter_keeps(
        tmp_path: Path, status: int) -> None:
    import threading

    from tickwheel.service.webhook import MAX_ANSWER_BYTES

    sent = [0]
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:  # says 1 GiB follows, and sends while the client reads
        connection, _ = listener.accept()
        with connection:
            head = b""
            while b"\r\n\r\n" not in head:
                head += connection.recv(65_536)
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            body = head.split(b"\r\n\r\n", 1)[1]
            while len(body) < length:
                body += connection.recv(65_536)
            connection.sendall(b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n"
                               % (status, 1 << 30))
            chunk = b"x" * 65_536
            try:
                while sent[0] < 1 << 30:
                    connection.sendall(chunk)
                    sent[0] += len(chunk)
            except OSError:  # the client closed: it read enough
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    webhook = WebhookProcessor(f"http://127.0.0.1:{listener.getsockname()[1]}/hook",
                               tmp_path / "dead-letter", timeout_s=5)
    result = webhook.process_batch(ROWS)
    webhook.close()
    thread.join(timeout=30)
    listener.close()
    assert not thread.is_alive()
    assert sent[0] < 64 * MAX_ANSWER_BYTES  # what the socket buffers took, no more
    if status == 200:
        assert result is ProcessingResult.SUCCESS
    else:
        (letter,) = (tmp_path / "dead-letter").glob("*.json")
        assert json.loads(letter.read_text())["answer"] == "x" * MAX_ANSWER_BYTES
