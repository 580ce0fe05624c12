"""The service with three targets, on both engines: each outcome reaches its own target
with its payload, at least once across kill -9, and never another target; one that
hangs holds up no other. Loopback only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")

from tests.conftest import eventually
from tests.service.conftest import service_url
from tests.service.receiver import Receiver, receiving
from tickwheel.client import Client, RowsRefused
from tickwheel.pipeline.engines.following import wall_clock_ms

NAMES = ("coupons", "earnings", "orders")


def _trigger_ms(extra: tuple[str, ...]) -> str:
    # A Spark micro-batch takes longer than 100 ms here: back to back, they would keep
    # both cores busy for the whole test.
    return "500" if "spark" in extra else "100"


def _service(tmp_path: Path, targets: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    child = subprocess.Popen(
        [sys.executable, "-m", "tickwheel.cli", "run", "--follow", "--clock", "wall",
         "--lateness-ms", "100", "--trigger-ms", _trigger_ms(extra),
         "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
         "--listen", "127.0.0.1:0",
         "--targets", str(targets), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    return child, service_url(child)


def _targets(tmp_path: Path, receivers: dict[str, Receiver]) -> Path:
    path = tmp_path / "targets.toml"
    path.write_text("".join(
        f'[targets.{name}]\nurls = ["{receiver.url}"]\nretry_ms = 200\nmax_batch = 20\n'
        f'timeout_ms = 60000\n' for name, receiver in receivers.items()))
    return path


def _by_target(receivers: dict[str, Receiver]) -> dict[str, set[str]]:
    return {name: {o["op_id"] for r in receiver.requests for o in r["outcomes"]}
            for name, receiver in receivers.items()}


def _delivered(receivers: dict[str, Receiver]) -> dict[str, set[str]]:
    got: dict[str, set[str]] = {}
    for name, receiver in receivers.items():
        with receiver.lock:
            got[name] = {o["op_id"] for r, s in zip(receiver.requests, receiver.statuses,
                                                   strict=True)
                         if 200 <= s < 300 for o in r["outcomes"]}
    return got


@pytest.mark.parametrize("engine", [
    pytest.param((), id="local"),
    pytest.param(("--engine", "spark", "--partitions", "2"), id="spark",
                 marks=[pytest.mark.spark, pytest.mark.slow]),
])
def test_each_outcome_reaches_its_own_target_with_its_payload(
        tmp_path: Path, engine: tuple[str, ...]) -> None:
    (tmp_path / "in").mkdir()
    extra = engine + (("--conf", f"spark.local.dir={tmp_path / 'spark-local'}")
                      if engine else ())
    with receiving(lambda _n: 200) as a, receiving(lambda _n: 200) as b, \
            receiving(lambda _n: 200) as c:
        receivers = dict(zip(NAMES, (a, b, c), strict=True))
        child, url = _service(tmp_path, _targets(tmp_path, receivers), *extra)
        try:
            with Client(url) as client:
                client.wait_ready(timeout_s=240)
                now = wall_clock_ms()
                for i, name in enumerate(NAMES):
                    client.schedule_at(f"{name}-op", now + 300, target=name,
                                       payload={"n": i, "for": name})
                client.schedule(f"{NAMES[0]}-every", {"every_ms": 1_000}, target=NAMES[0],
                                payload={"coupon": "SAVE10"})
                with pytest.raises(RowsRefused) as refused:
                    client.schedule_at("lost", now + 300, target="growth")
                assert refused.value.refused[0].reason == "unknown_target"
            assert eventually(lambda: all(f"{name}-op" in _delivered(receivers)[name]
                                          for name in NAMES), 240,
                              unless=lambda: child.poll() is not None)
            assert eventually(lambda: any(i.startswith("coupons-every@")
                                          for i in _delivered(receivers)["coupons"]), 60)
            status = httpx_status(url)
            assert set(status["delivery"]["targets"]) == set(NAMES)
        finally:
            child.send_signal(signal.SIGTERM)
            child.communicate(timeout=120)
    for name, receiver in receivers.items():
        sent = [o for r in receiver.requests for o in r["outcomes"]]
        assert all(o["target"] == name for o in sent)
        (op,) = [o for o in sent if o["op_id"] == f"{name}-op"]
        assert op["payload"] == {"n": NAMES.index(name), "for": name}
    fired = [o for r in a.requests for o in r["outcomes"] if o["outcome"] == "fired"]
    assert fired and all(o["payload"] == {"coupon": "SAVE10"} for o in fired)


def httpx_status(url: str) -> dict[str, object]:
    import httpx

    body: dict[str, object] = httpx.get(f"{url}/v1/status", timeout=30).json()
    return body


@pytest.mark.slow
@pytest.mark.parametrize("engine", [
    pytest.param((), id="local"),
    pytest.param(("--engine", "spark", "--partitions", "2"), id="spark",
                 marks=[pytest.mark.spark]),
])
def test_kill_9_with_three_targets_in_flight_loses_none_and_crosses_none(
        tmp_path: Path, engine: tuple[str, ...]) -> None:
    (tmp_path / "in").mkdir()
    extra = engine + (("--conf", f"spark.local.dir={tmp_path / 'spark-local'}")
                      if engine else ())
    waves, per_wave = 6, 30
    expected = {name: {f"{name}-{w}-{i}" for w in range(waves) for i in range(per_wave)}
                for name in NAMES}
    # One target answers in 2 s while the kill comes: its requests are in flight.
    with receiving(lambda _n: 200) as a, \
            receiving(lambda _n: 200, delay_s=2.0) as b, \
            receiving(lambda n: 500 if n % 2 == 0 else 200) as c:
        receivers = dict(zip(NAMES, (a, b, c), strict=True))
        targets = _targets(tmp_path, receivers)
        child, url = _service(tmp_path, targets, *extra)
        try:
            with Client(url) as client:
                client.wait_ready(timeout_s=240)
                for wave in range(waves):
                    now = wall_clock_ms()
                    client.submit([client.watch_row(f"{name}-{wave}-{i}", now + 100,
                                                    target=name, payload={"w": wave})
                                   for name in NAMES for i in range(per_wave)])
            assert eventually(lambda: len(_by_target(receivers)["earnings"]) > 0, 240,
                              unless=lambda: child.poll() is not None)
        finally:
            child.kill()  # kill -9: in-flight requests and unsettled batches are cut
            child.communicate(timeout=60)
        b.delay_s = 0.0
        child, url = _service(tmp_path, targets, *extra)
        try:
            assert eventually(lambda: _delivered(receivers) == expected, 240,
                              unless=lambda: child.poll() is not None)
        finally:
            child.send_signal(signal.SIGTERM)
            child.communicate(timeout=120)
    for name, receiver in receivers.items():
        sent = {o["op_id"] for r in receiver.requests for o in r["outcomes"]}
        assert sent == expected[name]  # every one of its own, none of another's
        assert all(json.loads(json.dumps(o["payload"])) == {"w": int(o["op_id"].split("-")[1])}
                   for r in receiver.requests for o in r["outcomes"])
