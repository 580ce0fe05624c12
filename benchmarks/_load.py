"""The service benchmark's load generator: requests at a fixed rate, each one's latency
from when it is due to be sent to its whole answer, so that a server that falls behind
is charged for the wait (open loop, no coordinated omission).

Two clients send the same requests over keep-alive connections on loopback:

- ``h11`` (the default): h11's sans-I/O HTTP/1.1 on asyncio protocols, a request written
  the moment it is due on an idle connection, its answer taken in ``data_received``;
- ``aiohttp``: aiohttp's client session, a task per request.

On a small machine the generator shares the cores with the server it measures, and a
group commit answers many requests at once, which one process reads one after another:
the leaner client takes less of both (docs/benchmarks.md, "Service").

``python -m benchmarks._load URL PHASE ROWS_PER_REQUEST ROWS_S SECONDS MODE CLIENT
OUT`` runs it in a process of its own and writes its :class:`LoadResult` to OUT as JSON.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import h11

__all__ = ["FIRE_IN_MS", "LOAD_CLIENTS", "MAX_IN_FLIGHT", "TARGETS", "LoadResult",
           "run_load"]

#: How far ahead a ``fire`` request's deadlines are ("do X in 2 s").
FIRE_IN_MS: Final = 2_000
#: Requests in flight at most; one due beyond that is counted, not sent.
MAX_IN_FLIGHT: Final = 512
LOAD_CLIENTS: Final = ("h11", "aiohttp")
#: How long after the last request is due its answers are waited for.
_ANSWER_WITHIN_S: Final = 30.0


@dataclass
class LoadResult:
    rows_acked: int = 0
    seconds: float = 0.0  # from the first request's due time to the last answer
    errors: int = 0  # answered other than 200, not answered, or the connection failed
    overloaded: int = 0  # requests not sent: MAX_IN_FLIGHT in flight
    latency_ms: list[float] = field(default_factory=list)  # of each 200


#: The targets a ``targets`` load's rows name, in turn.
TARGETS: Final = ("a", "b", "c")


def _body(phase: str, index: int, rows: int, fire: bool, targets: bool = False) -> bytes:
    """Request ``index``'s rows, as JSON Lines: watches with distinct op ids (naming
    :data:`TARGETS` in turn, with a payload, where ``targets``)."""
    now = time.time_ns() // 1_000_000
    deadline = now + (FIRE_IN_MS if fire else 3_600_000)
    lines = []
    for i in range(rows):
        row: dict[str, object] = {"type": "watch", "op_id": f"{phase}-{index}-{i}",
                                  "keys": [], "condition": "none", "deadline_ms": deadline}
        if targets:
            row["target"] = TARGETS[i % len(TARGETS)]
            row["payload"] = {"order": i, "note": "x" * 40}
        lines.append(json.dumps(row, separators=(",", ":")) + "\n")
    return "".join(lines).encode()


async def run_load(url: str, *, phase: str, rows_per_request: int, rows_s: int,
                   seconds: float, fire: bool = False, client: str = "h11",
                   targets: bool = False) -> LoadResult:
    """``rows_s / rows_per_request`` requests a second to ``url``/v1/events for
    ``seconds``, each with an ``Idempotency-Key`` of ``phase`` and its index."""
    if client not in LOAD_CLIENTS:
        raise ValueError(f"client is one of {', '.join(LOAD_CLIENTS)}, not {client!r}")
    result = LoadResult()
    sender = _H11Sender(url, result) if client == "h11" else _AiohttpSender(url, result)
    rate = rows_s / rows_per_request  # requests a second
    started = time.perf_counter()
    async with sender:
        for index in range(int(rate * seconds)):
            due = started + index / rate
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            if sender.in_flight >= MAX_IN_FLIGHT:
                result.overloaded += 1
                continue
            sender.send(_body(phase, index, rows_per_request, fire, targets),
                        f"{phase}-{index}", due, rows_per_request)
        await sender.drain(time.perf_counter() + _ANSWER_WITHIN_S)
    result.seconds = time.perf_counter() - started
    return result


class _Sender:
    """Sends a request and records its answer in ``result``; ``in_flight`` counts the
    requests sent and not yet answered or failed."""

    def __init__(self, url: str, result: LoadResult) -> None:
        parts = urlsplit(url)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"{url!r} has no host and port")
        self.host, self.port = parts.hostname, parts.port
        self.result = result
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._given_up = False  # answers that come after drain gave up are not counted

    def send(self, body: bytes, key: str, due: float, rows: int) -> None:
        raise NotImplementedError

    def answered(self, status: int, due: float, rows: int) -> None:
        if self._given_up:
            return
        self.in_flight -= 1
        if status == 200:
            self.result.rows_acked += rows
            self.result.latency_ms.append((time.perf_counter() - due) * 1000)
        else:
            self.result.errors += 1
        if not self.in_flight:
            self._idle.set()

    async def drain(self, deadline: float) -> None:
        """Until every request is answered, or ``deadline``: those left are errors."""
        while self.in_flight:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), deadline - time.perf_counter())
            except TimeoutError:
                self.result.errors += self.in_flight
                self.in_flight, self._given_up = 0, True

    async def __aenter__(self) -> _Sender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class _H11Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request on it at a time."""

    def __init__(self, sender: _H11Sender) -> None:
        h11 = self._h11 = sender.h11
        self.sender = sender
        self.http = h11.Connection(h11.CLIENT)
        self.transport: asyncio.Transport | None = None
        self.waiting: tuple[float, int] | None = None  # (due, rows) of the request on it
        self._status = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def request(self, head: h11.Request, body: bytes, due: float, rows: int) -> None:
        assert self.transport is not None and self.waiting is None
        h11 = self._h11
        self.waiting = (due, rows)
        self.transport.write(self.http.send(head) + self.http.send(h11.Data(data=body))
                             + self.http.send(h11.EndOfMessage()))

    def data_received(self, data: bytes) -> None:
        if self.waiting is None:  # an answer to nothing asked: the connection is broken
            self._fail()
            return
        h11 = self._h11
        self.http.receive_data(data)
        try:
            while (event := self.http.next_event()) is not h11.NEED_DATA:
                if isinstance(event, h11.Response):
                    self._status = event.status_code
                elif isinstance(event, h11.EndOfMessage):
                    self._finish(self._status)
                    return
                elif isinstance(event, h11.ConnectionClosed):
                    break
        except h11.RemoteProtocolError:
            pass
        self._fail()

    def _finish(self, status: int) -> None:
        assert self.waiting is not None
        (due, rows), self.waiting = self.waiting, None
        self.sender.answered(status, due, rows)
        h11 = self._h11
        extra, _ = self.http.trailing_data  # bytes after the answer answer nothing asked
        if (self.http.our_state is h11.DONE and self.http.their_state is h11.DONE
                and not extra):
            self.http.start_next_cycle()
            self.sender.idle_connection(self)
        else:  # the server closes it (Connection: close), or it is broken
            self.close()

    def _fail(self) -> None:
        if self.waiting is not None:
            due, rows = self.waiting
            self.waiting = None
            self.sender.answered(0, due, rows)
        self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.sender.forget(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail()


class _H11Sender(_Sender):
    def __init__(self, url: str, result: LoadResult) -> None:
        import h11  # the service extra's: other benchmarks run without it

        super().__init__(url, result)
        self.h11 = h11
        self._idle_connections: list[_H11Connection] = []
        self._connections: set[_H11Connection] = set()
        self._opening: set[asyncio.Task[None]] = set()

    def send(self, body: bytes, key: str, due: float, rows: int) -> None:
        head = self.h11.Request(method="POST", target="/v1/events", headers=[
            ("Host", f"{self.host}:{self.port}"), ("Idempotency-Key", key),
            ("Content-Type", "application/x-ndjson"), ("Content-Length", str(len(body)))])
        self.in_flight += 1
        if self._idle_connections:
            self._idle_connections.pop().request(head, body, due, rows)
            return
        task = asyncio.create_task(self._open_and_send(head, body, due, rows))
        self._opening.add(task)
        task.add_done_callback(self._opening.discard)

    async def _open_and_send(self, head: h11.Request, body: bytes, due: float,
                             rows: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await loop.create_connection(lambda: _H11Connection(self),
                                                         self.host, self.port)
        except OSError:
            self.answered(0, due, rows)
            return
        self._connections.add(connection)
        connection.request(head, body, due, rows)

    def idle_connection(self, connection: _H11Connection) -> None:
        self._idle_connections.append(connection)

    def forget(self, connection: _H11Connection) -> None:
        self._connections.discard(connection)
        if connection in self._idle_connections:
            self._idle_connections.remove(connection)

    async def __aexit__(self, *exc: object) -> None:
        for task in list(self._opening):
            task.cancel()
        for connection in list(self._connections):
            connection.close()


class _AiohttpSender(_Sender):
    def __init__(self, url: str, result: LoadResult) -> None:
        import aiohttp

        super().__init__(url, result)
        self._url = f"http://{self.host}:{self.port}/v1/events"
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=MAX_IN_FLIGHT),
            timeout=aiohttp.ClientTimeout(total=_ANSWER_WITHIN_S))
        self._tasks: set[asyncio.Task[None]] = set()

    def send(self, body: bytes, key: str, due: float, rows: int) -> None:
        self.in_flight += 1
        task = asyncio.create_task(self._post(body, key, due, rows))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, body: bytes, key: str, due: float, rows: int) -> None:
        import aiohttp

        status = 0
        try:
            async with self._session.post(self._url, data=body,
                                          headers={"Idempotency-Key": key,
                                                   "Content-Type": "application/x-ndjson"},
                                          ) as response:
                await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError):
            pass
        self.answered(status, due, rows)

    async def __aexit__(self, *exc: object) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self._session.close()


def _main(argv: list[str]) -> None:
    url, phase, rows_per_request, rows_s, seconds, mode, client, out = argv
    result = asyncio.run(run_load(url, phase=phase, rows_per_request=int(rows_per_request),
                                  rows_s=int(rows_s), seconds=float(seconds),
                                  fire=mode in ("fire", "targets"), client=client,
                                  targets=mode == "targets"))
    Path(out).write_text(json.dumps(dataclasses.asdict(result)))


if __name__ == "__main__":  # one phase's load, in a process of its own
    _main(sys.argv[1:])
