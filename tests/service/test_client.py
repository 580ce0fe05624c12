"""tickwheel.client: rows sent, retried under one key, refusals raised with reasons."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

pytest.importorskip("aiohttp")

from tests.service.conftest import landed_rows
from tickwheel import Schedule, ScheduleError
from tickwheel.client import AsyncClient, Client, RowsRefused, SubmitError, SubmitUnavailable
from tickwheel.service.server import SubmitServer


def landed(server: SubmitServer) -> list[dict[str, object]]:
    return landed_rows(server.input_dir)


def test_schedule_at_and_cancel_land_a_watch_and_a_cancel(server: SubmitServer) -> None:
    when = datetime(2030, 1, 1, tzinfo=UTC)
    with Client(server.url) as client:
        accepted = client.schedule_at("order-17", when)
        client.cancel("order-17")
        client.submit([{"type": "update", "key": "k", "value": 3}])
        assert client.status()["intake"]["accepted_rows"] == 3
    assert accepted.accepted == 1 and not accepted.replayed
    assert landed(server) == [
        {"ts_ms": 5_000, "type": "watch", "op_id": "order-17", "deadline_ms": 1_893_456_000_000,
         "condition": "none", "keys": []},
        {"ts_ms": 5_000, "type": "cancel", "op_id": "order-17"},
        {"ts_ms": 5_000, "type": "update", "key": "k", "value": 3}]


def test_the_recurring_forms_land_schedule_rows(server: SubmitServer) -> None:
    with Client(server.url) as client:
        client.schedule("coupons", Schedule(cron="0 * * * *", tz="Asia/Shanghai"))
        client.schedule("tags", {"every_ms": 900_000, "misfire": "skip"})
        client.pause("tags")
        client.resume("tags")
        client.unschedule("coupons")
        with pytest.raises(ScheduleError, match="tz"):
            client.schedule("bad", {"cron": "* * * * *", "tz": "Mars/Olympus"})
    assert landed(server) == [
        {"ts_ms": 5_000, "type": "schedule", "schedule_id": "coupons", "cron": "0 * * * *",
         "tz": "Asia/Shanghai"},
        {"ts_ms": 5_000, "type": "schedule", "schedule_id": "tags", "every_ms": 900_000,
         "misfire": "skip"},
        {"ts_ms": 5_000, "type": "pause", "schedule_id": "tags"},
        {"ts_ms": 5_000, "type": "resume", "schedule_id": "tags"},
        {"ts_ms": 5_000, "type": "unschedule", "schedule_id": "coupons"}]


def test_a_schedule_the_engines_would_refuse_is_refused_by_the_service(
        server: SubmitServer) -> None:
    with Client(server.url) as client, pytest.raises(RowsRefused) as refused:
        client.submit({"type": "schedule", "schedule_id": "feb-30", "cron": "0 0 30 2 *"})
    assert [r.reason for r in refused.value.refused] == ["bad_schedule"]


def test_the_same_key_twice_is_written_once(server: SubmitServer) -> None:
    with Client(server.url) as client:
        first = client.schedule_at("a", 10_000, idempotency_key="order-a")
        again = client.schedule_at("a", 10_000, idempotency_key="order-a")
    assert again.replayed and again.file == first.file
    assert len(landed(server)) == 1


def test_a_refused_row_raises_with_its_reason(server: SubmitServer) -> None:
    with Client(server.url) as client, pytest.raises(RowsRefused) as refused:
        client.submit([{"type": "watch", "op_id": "a"}, {"type": "tick"}])
    assert [(r.index, r.reason) for r in refused.value.refused] == [(0, "missing_field")]
    assert landed(server) == []


def test_a_naive_datetime_is_refused_before_sending(server: SubmitServer) -> None:
    with Client(server.url) as client, pytest.raises(ValueError, match="time zone"):
        client.schedule_at("a", datetime(2030, 1, 1))


def _flaky(answers: list[int], seen: list[httpx.Request]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status = answers.pop(0) if answers else 200
        if status == 0:
            raise httpx.ConnectError("refused", request=request)
        if status != 200:
            return httpx.Response(status, json={"error": "busy"}, headers={"Retry-After": "0"})
        return httpx.Response(200, json={"accepted": 1, "file": "f", "ts_ms": 1})
    return httpx.MockTransport(handle)


def test_congestion_and_lost_connections_are_retried_under_one_key() -> None:
    seen: list[httpx.Request] = []
    with Client("http://127.0.0.1:1", backoff_s=0.001,
                transport=_flaky([503, 0, 429, 502], seen)) as client:
        accepted = client.cancel("a")
    assert accepted.accepted == 1 and len(seen) == 5
    assert len({r.headers["Idempotency-Key"] for r in seen}) == 1


def test_giving_up_after_the_retries_says_so() -> None:
    seen: list[httpx.Request] = []
    with Client("http://127.0.0.1:1", retries=2, backoff_s=0.001,
                transport=_flaky([503] * 10, seen)) as client, \
            pytest.raises(SubmitUnavailable, match="after 2 retries"):
        client.cancel("a")
    assert len(seen) == 3


def test_a_permanent_refusal_is_not_retried() -> None:
    seen: list[httpx.Request] = []
    with Client("http://127.0.0.1:1", backoff_s=0.001,
                transport=_flaky([422], seen)) as client, \
            pytest.raises(SubmitError) as error:
        client.cancel("a")
    assert error.value.status == 422 and len(seen) == 1


def test_the_async_client_does_the_same(server: SubmitServer) -> None:
    async def main() -> list[bool]:
        async with AsyncClient(server.url) as client:
            first = await client.schedule_at("a", 10_000, idempotency_key="k")
            again = await client.schedule_at("a", 10_000, idempotency_key="k")
            await client.cancel("a")
            await client.schedule("s", Schedule(every_ms=60_000))
            await client.pause("s")
            with pytest.raises(RowsRefused):
                await client.submit({"type": "nope"})
            assert (await client.status())["intake"]["replayed"] == 1
            return [first.replayed, again.replayed]

    assert asyncio.run(main()) == [False, True]
    assert [r["type"] for r in landed(server)] == ["watch", "cancel", "schedule", "pause"]


def test_the_async_client_retries_too() -> None:
    seen: list[httpx.Request] = []

    async def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) < 3:
            return httpx.Response(503, headers={"Retry-After": "0"})
        return httpx.Response(200, json={"accepted": 1, "file": "f", "ts_ms": 1})

    async def main() -> None:
        async with AsyncClient("http://127.0.0.1:1", backoff_s=0.001,
                               transport=httpx.MockTransport(handle)) as client:
            await client.cancel("a")

    asyncio.run(main())
    assert len(seen) == 3 and len({r.headers["Idempotency-Key"] for r in seen}) == 1


@pytest.mark.parametrize("body", [b"<html>hello</html>", b'{"ok": true}', b"[1]",
                                  b'{"accepted": "1", "file": "f", "ts_ms": 1}'])
def test_a_200_that_is_not_the_apis_answer_is_a_submit_error(body: bytes) -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body)

    with Client("http://127.0.0.1:1", transport=httpx.MockTransport(handle)) as client, \
            pytest.raises(SubmitError, match="not the submit API's answer") as error:
        client.cancel("a")
    assert error.value.status == 200


def test_a_refusal_whose_body_is_not_the_apis_says_what_came() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": "nope", "refused": [{"index": "x"}]})

    with Client("http://127.0.0.1:1", transport=httpx.MockTransport(handle)) as client, \
            pytest.raises(SubmitError, match=r"nope \(400\)"):
        client.cancel("a")


def test_lines_are_sent_as_written(server: SubmitServer) -> None:
    twice = '{"type":"cancel","op_id":"a","op_id":"b"}'
    with Client(server.url) as client:
        with pytest.raises(RowsRefused) as refused:
            client.submit_lines([twice])
        assert refused.value.refused[0].reason == "duplicate_field"
        with pytest.raises(ValueError, match="spans lines"):
            client.submit_lines(['{"type":"cancel",\n"op_id":"a"}'])
        client.submit_lines(['{"type":"cancel", "op_id":"a"}'])
    assert landed(server) == [{"ts_ms": 5_000, "type": "cancel", "op_id": "a"}]
    (path,) = server.input_dir.glob("submit-*.jsonl")
    assert path.read_text() == '{"ts_ms":5000,"type":"cancel", "op_id":"a"}\n'


def test_the_submit_command_forwards_rows_unchanged(server: SubmitServer,
                                                    tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tickwheel.cli import app

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"type":"cancel","op_id":"a","op_id":"b"}\n')
    refused = CliRunner().invoke(app, ["submit", server.url, str(rows)])
    assert refused.exit_code == 1 and "duplicate_field" in refused.output
    assert landed(server) == []
    rows.write_text('{"type":"cancel","op_id":"a"}\n')
    taken = CliRunner().invoke(app, ["submit", server.url, str(rows),
                                     "--idempotency-key", "k"])
    assert taken.exit_code == 0, taken.output
    rows.write_text('{"type":"cancel","op_id":"b"}\n')
    clash = CliRunner().invoke(app, ["submit", server.url, str(rows),
                                     "--idempotency-key", "k"])
    assert clash.exit_code == 1
    assert "new --idempotency-key" in clash.output
    assert "again with --idempotency-key k" not in clash.output


def test_wait_ready_returns_once_the_engine_runs(tmp_path: Path) -> None:
    import threading

    running = threading.Event()
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=lambda: 5_000,
                      ready=running.is_set) as server, Client(server.url) as client:
        assert client.status()["ready"] is False
        with pytest.raises(SubmitUnavailable, match="the engine is starting"):
            client.wait_ready(timeout_s=0.3, poll_s=0.05)
        assert client.cancel("a").accepted == 1  # rows are taken meanwhile
        threading.Timer(0.2, running.set).start()
        client.wait_ready(timeout_s=30, poll_s=0.05)
        assert client.status()["ready"] is True

        async def main() -> None:
            async with AsyncClient(server.url) as async_client:
                await async_client.wait_ready(timeout_s=30)

        asyncio.run(main())


def test_wait_ready_on_no_service_says_what_it_last_saw() -> None:
    with Client("http://127.0.0.1:1", retries=0) as client, \
            pytest.raises(SubmitUnavailable, match="ConnectError"):
        client.wait_ready(timeout_s=0.2, poll_s=0.05)
