"""The service benchmark's load generator: every request due is sent once, at its rate,
with its key; only a 200 is acknowledged, timed from when the request was due; failures,
closed connections and a full window are counted, never waited on forever."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from benchmarks import _load
from benchmarks._load import LOAD_CLIENTS, LoadResult, run_load

pytestmark = pytest.mark.realtime

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/events", handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def load(url: str, client: str, *, rows: int = 1, requests_s: int = 100,
         seconds: float = 0.2) -> Awaitable[LoadResult]:
    return run_load(url, phase="p", rows_per_request=rows, rows_s=requests_s * rows,
                    seconds=seconds, client=client)


@pytest.mark.parametrize("client", LOAD_CLIENTS)
def test_every_request_due_is_sent_once_with_its_key_and_timed_from_when_due(
        client: str) -> None:
    seen: dict[str, list[str]] = {}

    async def handler(request: web.Request) -> web.Response:
        lines = (await request.read()).decode().splitlines()
        seen[request.headers["Idempotency-Key"]] = [json.loads(x)["op_id"] for x in lines]
        await asyncio.sleep(0.02)
        return web.json_response({"accepted": len(lines)})

    async def main() -> LoadResult:
        async with serving(handler) as url:
            return await load(url, client, rows=3)

    result = asyncio.run(main())
    assert sorted(seen) == sorted(f"p-{i}" for i in range(20))  # 100/s for 0.2 s
    assert seen["p-7"] == ["p-7-0", "p-7-1", "p-7-2"]
    assert (result.rows_acked, result.errors, result.overloaded) == (60, 0, 0)
    assert len(result.latency_ms) == 20
    assert min(result.latency_ms) >= 20  # the answer, not the send, ends the latency
    assert result.seconds >= 0.19


@pytest.mark.parametrize("client", LOAD_CLIENTS)
def test_an_answer_other_than_200_is_an_error_not_acknowledged(client: str) -> None:
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        odd = int(request.headers["Idempotency-Key"].removeprefix("p-")) % 2
        return web.json_response({}, status=503 if odd else 200)

    async def main() -> LoadResult:
        async with serving(handler) as url:
            return await load(url, client)

    result = asyncio.run(main())
    assert (result.rows_acked, result.errors, len(result.latency_ms)) == (10, 10, 10)


@pytest.mark.parametrize("client", LOAD_CLIENTS)
def test_a_server_that_closes_each_connection_is_measured_all_the_same(client: str) -> None:
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        response = web.json_response({"accepted": 1})
        response.force_close()
        return response

    async def main() -> LoadResult:
        async with serving(handler) as url:
            return await load(url, client)

    result = asyncio.run(main())
    assert (result.rows_acked, result.errors) == (20, 0)


def test_a_connection_that_answers_twice_is_dropped_and_the_load_goes_on() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            writer.write(answer + answer)  # the second answers nothing

    async def main() -> tuple[LoadResult, int]:
        handlers: set[asyncio.Task[object]] = set()

        async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          ) -> None:
            handlers.add(asyncio.current_task())  # type: ignore[arg-type]
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                await serve(reader, writer)
            writer.close()

        server = await asyncio.start_server(counted, "127.0.0.1", 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            result = await load(f"http://127.0.0.1:{port}", "h11", seconds=0.1)
            await asyncio.wait(handlers, timeout=5)  # each sees its connection closed
        return result, len(handlers)

    result, connections = asyncio.run(main())
    assert (result.rows_acked, result.errors) == (10, 0)
    assert connections == 10  # none was used again after its extra answer


@pytest.mark.parametrize("client", LOAD_CLIENTS)
def test_a_refused_connection_is_counted_an_error(client: str) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response()

    async def main() -> LoadResult:
        async with serving(handler) as url:
            pass  # closed: its port now refuses connections
        return await load(url, client)

    result = asyncio.run(main())
    assert (result.rows_acked, result.errors, result.latency_ms) == (0, 20, [])


@pytest.mark.parametrize("client", LOAD_CLIENTS)
def test_answers_not_given_in_time_are_errors_and_not_waited_for(
        client: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_load, "_ANSWER_WITHIN_S", 0.3)

    async def handler(request: web.Request) -> web.Response:
        await asyncio.sleep(3600)
        return web.Response()

    async def main() -> tuple[LoadResult, float]:
        async with serving(handler) as url:
            started = asyncio.get_running_loop().time()
            result = await load(url, client, seconds=0.1)
            return result, asyncio.get_running_loop().time() - started

    result, took = asyncio.run(main())
    assert (result.rows_acked, result.errors) == (0, 10)
    assert took < 10  # the drain gave up after 0.3 s, not an hour


@pytest.mark.parametrize("client", LOAD_CLIENTS)
def test_a_request_due_while_the_window_is_full_is_counted_not_sent(
        client: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_load, "MAX_IN_FLIGHT", 3)
    arrived: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        arrived.append(request.headers["Idempotency-Key"])
        await asyncio.sleep(1.0)  # every request is due within 0.1 s
        return web.json_response({"accepted": 1})

    async def main() -> LoadResult:
        async with serving(handler) as url:
            return await load(url, client, seconds=0.1)

    result = asyncio.run(main())
    assert sorted(arrived) == ["p-0", "p-1", "p-2"]
    assert (result.rows_acked, result.overloaded, result.errors) == (3, 7, 0)


def test_an_unknown_client_is_refused() -> None:
    with pytest.raises(ValueError, match="curl"):
        asyncio.run(run_load("http://127.0.0.1:1", phase="p", rows_per_request=1, rows_s=1,
                             seconds=1, client="curl"))
