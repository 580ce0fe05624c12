"""The whole service over loopback: rows submitted over HTTP fire and reach a webhook,
and every acknowledged row is applied once across kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("aiohttp")

from tests.conftest import eventually
from tests.service.conftest import service_url
from tests.service.receiver import receiving
from tickwheel.client import Client, RowsRefused, SubmitError
from tickwheel.pipeline.engines.following import wall_clock_ms

pytestmark = pytest.mark.realtime


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tickwheel.cli", *args], check=False,
                          capture_output=True, text=True, timeout=300)


def _trigger_ms(extra: tuple[str, ...]) -> str:
    # A Spark micro-batch takes longer than 100 ms here: back to back, they would keep
    # both cores busy for the whole test.
    return "500" if "spark" in extra else "100"


def _service(tmp_path: Path, webhook: str, *extra: str,
             lateness_ms: int = 100) -> tuple[subprocess.Popen[str], str]:
    """A following service with the submit API on a port of its own; its URL."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tickwheel.cli", "run", "--follow", "--clock", "wall",
         "--lateness-ms", str(lateness_ms), "--trigger-ms", _trigger_ms(extra),
         "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
         "--listen", "127.0.0.1:0",
         "--deliver-to", webhook, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    return child, service_url(child)


def _stop(child: subprocess.Popen[str]) -> str:
    child.send_signal(signal.SIGTERM)
    output, _ = child.communicate(timeout=120)
    assert child.returncode == 0, output
    return output


def _outcome_ids(output: Path) -> list[str]:
    import pyarrow.parquet as pq

    return [row["op_id"] for row in pq.read_table(output / "outcomes").to_pylist()]


def _quarantined(output: Path) -> list[tuple[str, str]]:
    import pyarrow.parquet as pq

    if not (output / "quarantine").exists():
        return []
    return [(row["reason"], row["raw"])
            for row in pq.read_table(output / "quarantine").to_pylist()]


def _intake(url: str) -> dict[str, int]:
    intake: dict[str, int] = httpx.get(f"{url}/v1/status").json()["intake"]
    return intake


def test_submitted_then_fired_then_delivered(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    with receiving(lambda _n: 200) as receiver:
        child, url = _service(tmp_path, receiver.url)
        try:
            with Client(url) as client:
                client.wait_ready(timeout_s=60)
                now = wall_clock_ms()
                client.schedule_at("job-0", now + 60_000)  # cancelled well before
                for i in range(1, 20):
                    client.schedule_at(f"job-{i}", now + 300)
                client.cancel("job-0")
                with pytest.raises(RowsRefused) as ahead:  # beyond the lateness bound
                    client.cancel("job-1", ts_ms=wall_clock_ms() + 60_000)
                assert ahead.value.refused[0].reason == "future"
            assert eventually(lambda: len(receiver.ids()) == 20, 60,
                              unless=lambda: child.poll() is not None)
            metrics = httpx.get(f"{url}/metrics").text
            assert 'tickwheel_intake_accepted_rows_total{intake="submit"} 21.0' in metrics
            assert eventually(lambda: 'tickwheel_webhook_delivered_total{target="default"} '
                              '20.0' in httpx.get(f"{url}/metrics").text, 30)
            assert 'tickwheel_webhook_lag_ms{target="default"}' in metrics
            assert 'tickwheel_pipeline_rows_in_total{pipeline="follow"}' in metrics
            # What the engine committed leaves the input directory; the newest stays.
            assert eventually(lambda: _intake(url)["unretired_files"] == 1, 30)
            assert sorted(p.name for p in (tmp_path / "in").iterdir()) == [
                max(p.name for p in (tmp_path / "in").iterdir())]
            assert _intake(url)["retired_files"] >= 1
        finally:
            output = _stop(child)
    outcomes = {o["op_id"]: o["outcome"] for r in receiver.requests for o in r["outcomes"]}
    assert outcomes == {"job-0": "cancelled", **{f"job-{i}": "expired" for i in range(1, 20)}}
    assert "delivered 20 outcomes" in output


def test_every_acknowledged_row_is_applied_once_across_kill_9(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    acked: list[str] = []
    stop = threading.Event()

    def stream(url: str, start: int) -> None:
        # Requests one after another; only an answered one counts as acknowledged.
        with Client(url, retries=0, timeout_s=5) as client:
            i = start
            while not stop.is_set():
                try:
                    client.schedule_at(f"op-{i}", wall_clock_ms() + 200,
                                       idempotency_key=f"op-{i}")
                except (SubmitError, OSError):
                    return  # the service died under it: this one is not acknowledged
                acked.append(f"op-{i}")
                i += 1

    with receiving(lambda _n: 200) as receiver:
        child, url = _service(tmp_path, receiver.url)
        sender = threading.Thread(target=stream, args=(url, 0))
        sender.start()
        assert eventually(lambda: len(acked) >= 300, 120,
                          unless=lambda: child.poll() is not None)
        child.send_signal(signal.SIGKILL)
        child.wait()
        sender.join(timeout=60)
        first = len(acked)
        child, url = _service(tmp_path, receiver.url)
        try:
            sender = threading.Thread(target=stream, args=(url, first + 1))
            sender.start()
            assert eventually(lambda: len(acked) >= first + 100, 120,
                              unless=lambda: child.poll() is not None)
            stop.set()
            sender.join(timeout=60)
            def undelivered() -> set[str]:
                return set(acked) - {i.removeprefix("op:").split("@")[0] for i in receiver.ids()}

            assert eventually(lambda: not undelivered(), 120,
                              unless=lambda: child.poll() is not None), (
                sorted(undelivered())[:5], _quarantined(tmp_path / "out")[:5])
        finally:
            stop.set()
            _stop(child)
    # Stamped by the server, no row is late, however long a commit or a batch took.
    assert _quarantined(tmp_path / "out") == []
    applied = _outcome_ids(tmp_path / "out")
    assert set(acked) <= set(applied)  # none lost
    assert len(applied) == len(set(applied))  # none twice, the one in flight included


def test_a_second_service_on_the_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    with receiving(lambda _n: 200) as receiver:
        child, _url = _service(tmp_path, receiver.url)
        try:
            second = _cli("run", "--follow", "--input", str(tmp_path / "in"), "--output",
                          str(tmp_path / "out"), "--listen", "0")
            assert second.returncode == 2 and "in use by pid" in second.stdout
        finally:
            _stop(child)


def test_listen_options_are_checked_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    batch = _cli("run", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                 "--listen", "0")
    assert batch.returncode == 2 and "--listen applies to --follow" in batch.stdout
    bad = _cli("run", "--follow", "--input", str(tmp_path / "in"), "--output",
               str(tmp_path / "out"), "--listen", "127.0.0.1:http")
    assert bad.returncode == 2 and "--listen" in bad.stdout
    assert not (tmp_path / "out").exists()


def test_a_key_segment_planted_as_a_symlink_is_refused_at_start(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    state = tmp_path / "out" / "_checkpoint" / "submit"
    state.mkdir(parents=True)
    (tmp_path / "elsewhere.jsonl").write_text("")
    (state / "keys-000000000.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    refused = _cli("run", "--follow", "--input", str(tmp_path / "in"), "--output",
                   str(tmp_path / "out"), "--listen", "0")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "not a key segment" in refused.stdout and "Traceback" not in refused.stderr


def test_submit_from_the_shell(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"type":"watch","op_id":"a","keys":[],"condition":"none",'
                    '"deadline_ms":99999999999999}\n{"type":"cancel","op_id":"a"}\n')
    with receiving(lambda _n: 200) as receiver:
        child, url = _service(tmp_path, receiver.url)
        try:
            done = _cli("submit", url, str(rows), "--idempotency-key", "load-1")
            assert done.returncode == 0, done.stdout + done.stderr
            assert "2 rows taken in 1 request" in done.stdout
            again = _cli("submit", url, str(rows), "--idempotency-key", "load-1")
            assert again.returncode == 0
            assert eventually(lambda: len(receiver.ids()) == 1, 60)
            bad = tmp_path / "bad.jsonl"
            bad.write_text('{"type":"watch","op_id":"b"}\n')
            refused = _cli("submit", url, str(bad))
            assert refused.returncode == 1 and "missing_field" in refused.stdout
            broken = tmp_path / "broken.jsonl"
            broken.write_text("{not json\n")
            unparsed = _cli("submit", url, str(broken))
            assert unparsed.returncode == 1 and "broken.jsonl:1" in unparsed.stdout
        finally:
            _stop(child)
    assert _outcome_ids(tmp_path / "out") == ["a"]  # the second submit wrote nothing
    assert _cli("submit", "ftp://x", str(rows)).returncode == 2
    assert _cli("submit", url, str(tmp_path / "missing.jsonl")).returncode == 2


@pytest.mark.spark
@pytest.mark.slow
def test_the_spark_engine_takes_rows_over_http_too(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    with receiving(lambda _n: 200) as receiver:
        child, url = _service(tmp_path, receiver.url, "--engine", "spark", "--partitions", "2",
                              "--conf", f"spark.local.dir={tmp_path / 'spark-local'}")
        try:
            with Client(url) as client:
                client.wait_ready(timeout_s=240)  # the query runs: deadlines fire on time
                client.schedule_at("later", wall_clock_ms() + 600_000)
                client.schedule_at("soon", wall_clock_ms() + 500)
                client.cancel("later")
                with pytest.raises(RowsRefused) as ahead:  # beyond the lateness bound
                    client.cancel("soon", ts_ms=wall_clock_ms() + 60_000)
                assert ahead.value.refused[0].reason == "future"
                assert client.status()["intake"]["accepted_rows"] == 3
            assert eventually(lambda: len(receiver.ids()) == 2, 240,
                              unless=lambda: child.poll() is not None)
            assert eventually(lambda: _intake(url)["unretired_files"] == 1, 60)
        finally:
            _stop(child)
    outcomes = {o["op_id"]: o["outcome"] for r in receiver.requests for o in r["outcomes"]}
    assert outcomes == {"later": "cancelled", "soon": "expired"}



def _engine_status(url: str) -> dict[str, object]:
    engine: dict[str, object] = httpx.get(f"{url}/v1/status", timeout=30).json()["engine"]
    return engine


@pytest.mark.parametrize("engine", [
    pytest.param((), id="local"),
    pytest.param(("--engine", "spark", "--partitions", "2"), id="spark",
                 marks=[pytest.mark.spark, pytest.mark.slow]),
])
def test_a_dead_receiver_never_holds_back_deadlines(tmp_path: Path,
                                                    engine: tuple[str, ...]) -> None:
    """A receiver that answers 500 for a while: the engine goes on resolving and
    writing its outputs, the status shows delivery behind, and once the receiver is
    back every outcome reaches it."""
    (tmp_path / "in").mkdir()
    dead = threading.Event()
    dead.set()
    extra = engine + (("--conf", f"spark.local.dir={tmp_path / 'spark-local'}")
                      if engine else ())
    with receiving(lambda _n: 500 if dead.is_set() else 200) as receiver:
        child, url = _service(tmp_path, receiver.url, *extra)
        try:
            with Client(url) as client:
                for wave in range(8):  # batches of their own, each well past two
                    now = wall_clock_ms()
                    client.submit([client.watch_row(f"w{wave}-{i}", now + 200)
                                   for i in range(50)])
                    assert eventually(
                        lambda w=wave: int(str(_engine_status(url)["by_outcome"].get(
                            "expired", 0))) >= 50 * (w + 1), 240,
                        unless=lambda: child.poll() is not None)
            assert receiver.ids() == set()  # nothing settled: it only ever said 500
            status = _engine_status(url)
            assert int(str(status["delivery_behind_batches"])) >= 3
            assert int(str(status["delivery_lag_ms"])) > 0
            assert "tickwheel_pipeline_delivery_behind_batches" in httpx.get(
                f"{url}/metrics", timeout=30).text
            dead.clear()
            assert eventually(lambda: len(receiver.ids()) == 400, 240,
                              unless=lambda: child.poll() is not None)
            assert eventually(lambda: _engine_status(url)["delivery_behind_batches"] == 0,
                              60)
        finally:
            _stop(child)
    assert len(_outcome_ids(tmp_path / "out")) == 400


def test_outcomes_a_dead_receiver_missed_are_delivered_after_a_restart(
        tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    dead = threading.Event()
    dead.set()
    with receiving(lambda _n: 500 if dead.is_set() else 200) as receiver:
        child, url = _service(tmp_path, receiver.url, "--stop-timeout-ms", "2000")
        try:
            with Client(url) as client:
                for wave in range(4):
                    client.submit([client.watch_row(f"w{wave}-{i}", wall_clock_ms() + 100)
                                   for i in range(50)])
                    assert eventually(
                        lambda w=wave: int(str(_engine_status(url)["by_outcome"].get(
                            "expired", 0))) >= 50 * (w + 1), 120,
                        unless=lambda: child.poll() is not None)
        finally:
            started = time.monotonic()
            output = _stop(child)
        assert time.monotonic() - started < 8  # the stop waits 2 s for the receiver
        assert "not delivered: the next start delivers them" in output
        assert receiver.ids() == set()
        dead.clear()
        child, url = _service(tmp_path, receiver.url)
        try:
            assert eventually(lambda: len(receiver.ids()) == 200, 120,
                              unless=lambda: child.poll() is not None)
        finally:
            _stop(child)
