"""The read API: GET /v1/schedules, /v1/schedules/{id} and /v1/operations/{op_id} answer
what the engine holds as of its last committed batch."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("pyarrow")

from tests.service.conftest import service_url
from tests.service.viewed import Service, row, schedule, watch
from tickwheel.client import Client, SubmitError
from tickwheel.service.server import SubmitServer


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[Service, str]]:
    engine = Service(tmp_path)
    server = SubmitServer(tmp_path / "in", tmp_path / "state", clock=lambda: 5_000,
                          view=engine.view, token="s3cret-token-0123456789")
    server.start()
    try:
        yield engine, server.url
    finally:
        server.stop()
        engine.close()


def _get(url: str, path: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{url}{path}", params=params,
                     headers={"Authorization": "Bearer s3cret-token-0123456789"})


def test_a_page_of_schedules_in_id_order(api: tuple[Service, str]) -> None:
    engine, url = api
    engine.feed([schedule(1_000, f"job-{n}", every_ms=60_000, anchor_ms=0)
                 for n in range(5)] + [row(1_001, "pause", "job-3")], 1_200)
    first = _get(url, "/v1/schedules", prefix="job-", limit=2).json()
    assert [s["schedule_id"] for s in first["schedules"]] == ["job-0", "job-1"]
    assert first["as_of_ms"] == 1_099
    assert first["schedules"][0] == {
        "schedule_id": "job-0", "state": "running",
        "spec": {"every_ms": 60_000, "anchor_ms": 0}, "summary": "every 1 min",
        "next_fire_ms": 60_000, "runs": 0,
        "skipped": 0, "last_fired_ms": None}
    rest = _get(url, "/v1/schedules", prefix="job-", cursor=first["next_cursor"]).json()
    assert [s["schedule_id"] for s in rest["schedules"]] == ["job-2", "job-3", "job-4"]
    assert rest["next_cursor"] is None
    paused = _get(url, "/v1/schedules", state="paused").json()
    assert [(s["schedule_id"], s["state"]) for s in paused["schedules"]] == [
        ("job-3", "paused")]


def test_one_schedule_with_its_upcoming_fires(api: tuple[Service, str]) -> None:
    engine, url = api
    engine.feed([schedule(1_000, "daily report", cron="0 9 * * *", tz="Europe/Paris")],
                1_200)
    answer = _get(url, "/v1/schedules/daily%20report")
    assert answer.status_code == 200
    body = answer.json()
    assert body["schedule_id"] == "daily report"
    assert body["spec"] == {"cron": "0 9 * * *", "tz": "Europe/Paris"}
    assert len(body["upcoming"]) == 5 and body["upcoming"][0] == body["next_fire_ms"]
    gaps = {b - a for a, b in zip(body["upcoming"], body["upcoming"][1:], strict=False)}
    assert gaps == {86_400_000}  # January: no change of offset within the five
    missing = _get(url, "/v1/schedules/nothing-here")
    assert missing.status_code == 404 and "nothing-here" in missing.json()["error"]


def test_an_operation_pending_then_resolved(api: tuple[Service, str]) -> None:
    engine, url = api
    engine.feed([watch(1_000, "order-17", 3_000)], 1_200)
    pending = _get(url, "/v1/operations/order-17").json()
    assert (pending["state"], pending["deadline_ms"], pending["keys"]) == (
        "pending", 3_000, ["k"])
    engine.feed([], 3_500)
    resolved = _get(url, "/v1/operations/order-17").json()
    assert resolved == {"op_id": "order-17", "state": "resolved", "outcome": "expired",
                        "resolved_ms": 3_000, "as_of_ms": 3_399}
    assert _get(url, "/v1/operations/order-18").status_code == 404


@pytest.mark.parametrize("params", [
    {"limit": "0"}, {"limit": "1001"}, {"limit": "ten"}, {"limit": "-5"},
    {"state": "stopped"}, {"cursor": "%%%"}, {"colour": "red"},
])
def test_bad_queries_are_refused_with_400_naming_what_is_wrong(
        api: tuple[Service, str], params: dict[str, str]) -> None:
    _, url = api
    answer = _get(url, "/v1/schedules", **params)
    assert answer.status_code == 400
    assert next(iter(params)) in answer.json()["error"]


def test_reads_need_the_token_too(api: tuple[Service, str]) -> None:
    _, url = api
    for path in ("/v1/schedules", "/v1/schedules/x", "/v1/operations/x"):
        assert httpx.get(f"{url}{path}").status_code == 401


def test_the_status_names_the_view_and_the_next_deadlines(api: tuple[Service, str]) -> None:
    engine, url = api
    engine.feed([watch(1_000, "b", 9_000), watch(1_000, "a", 7_000),
                 schedule(1_000, "s", every_ms=1_000)], 1_200)
    state = _get(url, "/v1/status").json()["state"]
    assert (state["schedules"], state["pending"], state["as_of_ms"]) == (1, 2, 1_099)
    assert [d["op_id"] for d in state["next_deadlines"]] == ["a", "b"]


@pytest.mark.parametrize("engine", [
    pytest.param((), id="local"),
    pytest.param(("--engine", "spark", "--partitions", "2"), id="spark",
                 marks=[pytest.mark.spark, pytest.mark.slow]),
])
def test_the_client_reads_what_it_submitted_once_applied(tmp_path: Path,
                                                         engine: tuple[str, ...]) -> None:
    extra = engine + (("--conf", f"spark.local.dir={tmp_path / 'spark-local'}")
                      if engine else ())
    child = subprocess.Popen([sys.executable, "-m", "tickwheel.cli", "serve", "--listen",
                              "127.0.0.1:0", *extra], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        url = service_url(child)
        with Client(url) as client:
            client.wait_ready(timeout_s=300)
            accepted = client.schedule("nightly", {"cron": "0 2 * * *", "tz": "Asia/Tokyo"})
            ordered = client.schedule_at("order-9", int(time.time() * 1000) + 3_600_000)
            client.wait_applied(max(accepted.ts_ms, ordered.ts_ms), timeout_s=120)
            nightly = client.get_schedule("nightly")
            assert nightly is not None and nightly["state"] == "running"
            assert len(nightly["upcoming"]) == 5
            order = client.get_operation("order-9")
            assert order is not None and order["state"] == "pending"
            assert client.get_schedule("none") is None
            paused = client.pause("nightly")
            client.wait_applied(paused.ts_ms, timeout_s=120)
            page = client.list_schedules(state="paused")
            assert [s["schedule_id"] for s in page["schedules"]] == ["nightly"]
            with pytest.raises(SubmitError, match="400"):
                client.list_schedules(limit=0)
    finally:
        child.send_signal(signal.SIGTERM)
        output, _ = child.communicate(timeout=120)
    assert child.returncode == 0, output


def _cli(tmp_path: Path, *args: str) -> Any:
    from typer.testing import CliRunner

    from tickwheel.cli import app

    token = tmp_path / "token"
    token.write_text("s3cret-token-0123456789\n")
    return CliRunner().invoke(app, [*args, "--token-file", str(token)])


def test_the_cli_lists_schedules_with_next_fires_in_their_zone_and_utc(
        api: tuple[Service, str], tmp_path: Path) -> None:
    engine, url = api
    engine.feed([schedule(1_000, "paris-9am", cron="0 9 * * *", tz="Europe/Paris"),
                 schedule(1_000, "tick", every_ms=60_000, anchor_ms=0)], 1_200)
    shown = _cli(tmp_path, "schedules", "list", url)
    assert shown.exit_code == 0, shown.output
    assert "1970-01-01 09:00:00 CET" in shown.output  # 08:00 UTC
    assert "1970-01-01 08:00:00 UTC" in shown.output
    assert "cron '0 9 * * *' in" in shown.output
    assert "every 1 min" in shown.output
    lines = _cli(tmp_path, "schedules", "list", url, "--json", "--prefix", "ti")
    assert lines.exit_code == 0
    assert [json.loads(line)["schedule_id"] for line in lines.output.splitlines()] == ["tick"]
    fewer = _cli(tmp_path, "schedules", "list", url, "--limit", "1")
    assert "more: raise --limit" in fewer.output and "tick" not in fewer.output


def test_the_cli_shows_a_schedule_and_an_operation(api: tuple[Service, str],
                                                   tmp_path: Path) -> None:
    engine, url = api
    engine.feed([schedule(1_000, "tick", every_ms=60_000, anchor_ms=0),
                 watch(1_000, "order-17", 90_000, ["pay:17"])], 1_200)
    shown = _cli(tmp_path, "schedules", "show", url, "tick")
    assert shown.exit_code == 0, shown.output
    assert "every 1 min (running)" in shown.output
    assert "1970-01-01 00:05:00 UTC" in shown.output  # the fifth upcoming fire
    op = _cli(tmp_path, "ops", "show", url, "order-17")
    assert op.exit_code == 0, op.output
    assert "pending" in op.output and "1970-01-01 00:01:30 UTC" in op.output
    assert "pay:17" in op.output
    as_json = _cli(tmp_path, "ops", "show", url, "order-17", "--json")
    assert json.loads(as_json.output)["deadline_ms"] == 90_000


def test_the_cli_says_clearly_what_is_missing_or_wrong(api: tuple[Service, str],
                                                      tmp_path: Path) -> None:
    _, url = api
    missing = _cli(tmp_path, "schedules", "show", url, "nope")
    assert missing.exit_code == 1 and "no schedule 'nope'" in missing.output
    no_op = _cli(tmp_path, "ops", "show", url, "nope")
    assert no_op.exit_code == 1 and "no operation 'nope'" in no_op.output
    bad_url = _cli(tmp_path, "schedules", "list", "ftp://127.0.0.1:1")
    assert bad_url.exit_code == 2 and "URL" in bad_url.output
    from typer.testing import CliRunner

    from tickwheel.cli import app

    unauthorized = CliRunner().invoke(app, ["schedules", "list", url])
    assert unauthorized.exit_code == 1 and "401" in unauthorized.output
    closed = _cli(tmp_path, "ops", "show", "http://127.0.0.1:9", "x")
    assert closed.exit_code == 1


def test_the_console_signs_in_with_a_cookie_derived_from_the_token(
        api: tuple[Service, str]) -> None:
    _, url = api
    page = httpx.get(f"{url}/")
    assert page.status_code == 401 and 'name="token"' in page.text
    assert httpx.get(f"{url}/console/console.js").status_code == 401
    wrong = httpx.post(f"{url}/console/login", data={"token": "guess-guess-guess-guess"})
    assert wrong.status_code == 401 and "not the token of this service" in wrong.text
    signed = httpx.post(f"{url}/console/login", data={"token": "s3cret-token-0123456789"})
    assert signed.status_code == 303 and signed.headers["location"] == "/"
    cookie = signed.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "s3cret-token-0123456789" not in cookie  # a value derived from it
    with httpx.Client(base_url=url, cookies=signed.cookies) as browser:
        console = browser.get("/")
        assert console.status_code == 200 and "tickwheel console" in console.text
        assert "default-src 'none'" in console.headers["content-security-policy"]
        script = browser.get("/console/console.js")
        assert script.headers["content-type"].startswith("text/javascript")
        assert browser.get("/console/../server.py").status_code == 404
        assert browser.get("/console/secrets.txt").status_code == 404
        assert browser.get("/v1/schedules").status_code == 200
    forged = httpx.get(f"{url}/v1/schedules", cookies={"tickwheel_console": "0" * 64})
    assert forged.status_code == 401


def test_a_huge_sign_in_form_is_refused_unread(api: tuple[Service, str]) -> None:
    _, url = api
    answer = httpx.post(f"{url}/console/login", content=b"token=" + b"x" * 100_000,
                        headers={"content-type": "application/x-www-form-urlencoded"})
    assert answer.status_code == 413


def test_recent_outcomes_and_the_history_of_rates(tmp_path: Path) -> None:
    engine = Service(tmp_path)
    server = SubmitServer(tmp_path / "in", tmp_path / "state", clock=lambda: 5_000,
                          view=engine.view)
    try:
        server.start()
        engine.feed([watch(1_000, "a", 1_500), schedule(1_000, "s", every_ms=1_000,
                                                         anchor_ms=0)], 1_200)
        server.sample(10_000)
        engine.feed([], 3_200)  # a expires at 1,500; s fires at 2,000 and 3,000
        server.sample(12_000)
        recent = httpx.get(f"{server.url}/v1/outcomes/recent").json()["outcomes"]
        assert [(o["op_id"], o["outcome"]) for o in recent] == [
            ("s@3000", "fired"), ("s@2000", "fired"), ("a", "expired")]
        samples = httpx.get(f"{server.url}/v1/history").json()["samples"]
        newest = samples[-1]
        assert newest["t_ms"] == 12_000
        assert (newest["fired_per_s"], newest["resolved_per_s"]) == (1.0, 0.5)
        assert newest["ack_p99_ms"] is None  # no request was answered in it
    finally:
        server.stop()
        engine.close()


def test_a_restarted_service_still_answers_what_it_resolved(tmp_path: Path) -> None:
    from tests.conftest import eventually

    def start() -> tuple[subprocess.Popen[str], str]:
        child = subprocess.Popen([sys.executable, "-m", "tickwheel.cli", "serve",
                                  "--listen", "127.0.0.1:0"], cwd=tmp_path,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return child, service_url(child)

    child, url = start()
    try:
        with Client(url) as client:
            client.wait_ready(timeout_s=60)
            client.schedule_at("order-5", int(time.time() * 1000) + 200)
            assert eventually(lambda: (client.get_operation("order-5") or {}).get(
                "state") == "resolved", 60)
    finally:
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=120)
    child, url = start()
    try:
        with Client(url) as client:
            found = client.get_operation("order-5")
            assert found is not None and found["outcome"] == "expired"
    finally:
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=120)


def test_a_schedule_and_a_pending_operation_show_their_target_and_payload(
        tmp_path: Path) -> None:
    engine = Service(tmp_path)
    server = SubmitServer(tmp_path / "in", tmp_path / "state", clock=lambda: 5_000,
                          view=engine.view, targets=frozenset({"coupons"}))
    server.start()
    try:
        engine.feed([schedule(1_000, "coupons-hourly", every_ms=3_600_000,
                              target="coupons", payload={"code": "SAVE10"}),
                     {**watch(1_000, "order-17", 9_000_000), "target": "coupons",
                      "payload": [1, "two"]}], 1_200)
        sched = httpx.get(f"{server.url}/v1/schedules/coupons-hourly").json()
        assert (sched["target"], sched["payload"]) == ("coupons", {"code": "SAVE10"})
        listed = httpx.get(f"{server.url}/v1/schedules").json()["schedules"][0]
        assert listed["payload"] == {"code": "SAVE10"}
        op = httpx.get(f"{server.url}/v1/operations/order-17").json()
        assert (op["target"], op["payload"]) == ("coupons", [1, "two"])
        # A row naming a target the service has not is refused, as is a large payload.
        unknown = httpx.post(f"{server.url}/v1/events", json={
            "type": "watch", "op_id": "x", "keys": [], "deadline_ms": 9_000,
            "condition": "none", "target": "growth"})
        assert unknown.status_code == 400
        assert unknown.json()["refused"][0]["reason"] == "unknown_target"
        large = httpx.post(f"{server.url}/v1/events", json={
            "type": "schedule", "schedule_id": "s", "every_ms": 1_000,
            "payload": "x" * 70_000})
        assert large.status_code == 400
        assert large.json()["refused"][0]["reason"] == "payload_too_large"
        taken = httpx.post(f"{server.url}/v1/events", json={
            "type": "watch", "op_id": "y", "keys": [], "deadline_ms": 9_000,
            "condition": "none", "target": "coupons", "payload": {"ok": True}})
        assert taken.status_code == 200
    finally:
        server.stop()
        engine.close()
