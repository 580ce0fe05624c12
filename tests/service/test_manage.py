"""Managing a schedule over HTTP: each request writes its row through the durable group
commit and is answered as POST /v1/events is, idempotency keys included."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

pytest.importorskip("aiohttp")

from tests.service.conftest import landed_rows
from tickwheel.service.intake import IntakeError, schedule_row
from tickwheel.service.server import SubmitServer


def landed(server: SubmitServer) -> list[dict[str, object]]:
    return landed_rows(server.input_dir)


def test_put_pause_resume_and_delete_write_their_rows(server: SubmitServer) -> None:
    url = f"{server.url}/v1/schedules/coupons"
    spec = {"cron": "0 * * * *", "tz": "Europe/London"}
    answers = [httpx.put(url, json=spec), httpx.post(f"{url}/pause"),
               httpx.post(f"{url}/resume"), httpx.delete(url)]
    assert [a.status_code for a in answers] == [200] * 4
    assert answers[0].json()["accepted"] == 1 and answers[0].json()["file"].startswith(
        "submit-")
    rows = landed(server)
    assert [(r["type"], r["schedule_id"]) for r in rows] == [
        ("schedule", "coupons"), ("pause", "coupons"), ("resume", "coupons"),
        ("unschedule", "coupons")]
    assert rows[0] == {"ts_ms": 5_000, "cron": "0 * * * *", "tz": "Europe/London",
                       "type": "schedule", "schedule_id": "coupons"}


def test_an_id_with_characters_escaped_in_the_path_is_the_id(server: SubmitServer) -> None:
    assert httpx.post(f"{server.url}/v1/schedules/a%2Fb%20c/pause").status_code == 200
    assert landed(server)[0]["schedule_id"] == "a/b c"


@pytest.mark.parametrize(("body", "reason"), [
    ({"cron": "0 25 * * *"}, "bad_schedule"),
    ({"every_ms": 1_000, "tz": "UTC"}, "bad_schedule"),
    ({"cron": "0 * * * *", "tz": "localtime"}, "bad_schedule"),
])
def test_a_bad_spec_is_refused_with_its_reason(server: SubmitServer, body: dict[str, object],
                                               reason: str) -> None:
    answer = httpx.put(f"{server.url}/v1/schedules/s", json=body)
    assert answer.status_code == 400
    assert answer.json()["refused"][0]["reason"] == reason
    assert landed(server) == []


@pytest.mark.parametrize("body", [b"", b"[]", b"{}", b"not json", b'{"cron": 1, "cron": 2}',
                                  b'{"cron": "0 * * * *", "schedule_id": "other"}',
                                  b'{"cron": "0 * * * *", "type": "pause"}'])
def test_a_put_body_that_is_not_one_schedules_fields_is_refused(server: SubmitServer,
                                                                 body: bytes) -> None:
    answer = httpx.put(f"{server.url}/v1/schedules/s", content=body)
    assert answer.status_code == 400, body
    assert "error" in answer.json()
    assert landed(server) == []


def test_an_id_that_would_make_occurrence_ids_ambiguous_is_refused(
        server: SubmitServer) -> None:
    answer = httpx.post(f"{server.url}/v1/schedules/x@1/pause")
    assert answer.status_code == 400 and answer.json()["refused"][0]["reason"] == "bad_id"


def test_a_pause_with_a_body_is_refused(server: SubmitServer) -> None:
    answer = httpx.post(f"{server.url}/v1/schedules/s/pause", content=b'{"x": 1}')
    assert answer.status_code == 400 and "takes no body" in answer.json()["error"]


def test_keys_make_management_requests_safe_to_retry(server: SubmitServer) -> None:
    url = f"{server.url}/v1/schedules/s"
    first = httpx.post(f"{url}/pause", headers={"Idempotency-Key": "k1"})
    again = httpx.post(f"{url}/pause", headers={"Idempotency-Key": "k1"})
    assert (first.status_code, again.status_code) == (200, 200)
    assert again.headers["Idempotent-Replayed"] == "true"
    other = httpx.post(f"{url}/resume", headers={"Idempotency-Key": "k1"})
    assert other.status_code == 422  # the same key for another action
    assert [r["type"] for r in landed(server)] == ["pause"]


def test_unknown_routes_and_methods_are_refused(server: SubmitServer) -> None:
    assert httpx.post(f"{server.url}/v1/schedules/s/explode").status_code == 404
    assert httpx.patch(f"{server.url}/v1/schedules/s").status_code == 405


def test_the_row_a_request_writes() -> None:
    assert json.loads(schedule_row("pause", "s", b"")) == {"type": "pause", "schedule_id": "s"}
    assert json.loads(schedule_row("schedule", "s", b'{"every_ms": 5}')) == {
        "every_ms": 5, "type": "schedule", "schedule_id": "s"}
    with pytest.raises(IntakeError, match="nested too deep"):
        schedule_row("schedule", "s", b'{"a":' * 100_000 + b"1" + b"}" * 100_000)


def test_the_schedules_command_manages_a_schedule(server: SubmitServer,
                                                  tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tickwheel.cli import app

    runner = CliRunner()
    for args in (["put", server.url, "coupons", '{"cron": "0 * * * *", "tz": "UTC"}'],
                 ["pause", server.url, "coupons"], ["resume", server.url, "coupons"],
                 ["delete", server.url, "coupons"]):
        done = runner.invoke(app, ["schedules", *args])
        assert done.exit_code == 0, done.output
    assert [r["type"] for r in landed(server)] == ["schedule", "pause", "resume",
                                                   "unschedule"]
    refused = runner.invoke(app, ["schedules", "put", server.url, "s", '{"cron": "0 25 * * *"}'])
    assert refused.exit_code == 1 and "bad_schedule" in refused.output
    bad_id = runner.invoke(app, ["schedules", "pause", server.url, "x@1"])
    assert bad_id.exit_code == 1 and "bad_id" in bad_id.output
    for args in (["put", server.url, "s", "not json"], ["put", server.url, "s", "[1]"],
                 ["pause", "ftp://x", "s"],
                 ["pause", server.url, "s", "--token-file", str(tmp_path / "none")]):
        assert runner.invoke(app, ["schedules", *args]).exit_code == 2, args
    assert len(landed(server)) == 4
