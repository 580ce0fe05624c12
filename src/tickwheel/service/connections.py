"""ConnectionGuard: what the submit API's clients can hold of the process.

Every connection costs a file descriptor, and the engine shares the process's limit:
clients that open connections without end would leave it no descriptor for its
checkpoint. So the listener takes at most ``max_connections`` at once, and a
connection beyond them is answered ``503`` with ``Retry-After`` and closed at once. A
connection that holds no request for ``header_timeout_s`` (an idle keep-alive one, or
one whose client sends a request head slowly, as a slowloris attack does) is closed.

It wraps the protocol that aiohttp's server makes for each connection (the documented
``loop.create_server(runner.server)`` form), and learns from the app's middleware when
a request's head is in and when its answer is out.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from aiohttp import web

__all__ = [
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_MAX_CONNECTIONS",
    "ENGINE_DESCRIPTORS",
    "ConnectionGuard",
    "connection_limit",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS: Final = 512
DEFAULT_HEADER_TIMEOUT_S: Final = 10.0
#: Descriptors left to the engine, its outputs and delivery whatever the clients do.
ENGINE_DESCRIPTORS: Final = 256
_REFUSAL: Final = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n"
                   b"Content-Type: application/json\r\nContent-Length: 46\r\n"
                   b"Connection: close\r\n\r\n"
                   b'{"error":"too many connections: retry later"}\n')


def connection_limit(wanted: int) -> int:
    """``wanted``, lowered where the process's open-file limit would leave the engine
    fewer than ``ENGINE_DESCRIPTORS`` descriptors (but not below 8)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return min(wanted, max(8, soft - ENGINE_DESCRIPTORS))


class _Guarded(asyncio.Protocol):
    """One connection: aiohttp's protocol inside, a deadline for its next request."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self.requests = 0  # in progress on this connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        guard = self._guard
        if len(guard.open) >= guard.max_connections:
            guard.refused += 1
            transport.write(_REFUSAL)
            transport.close()
            return
        guard.open[transport] = self
        inner = guard.factory()
        self._inner = inner
        inner.connection_made(transport)
        self.wait_for_request()

    def wait_for_request(self) -> None:
        """From now, a request head must come within the timeout."""
        self.cancel_deadline()
        self._deadline = asyncio.get_running_loop().call_later(
            self._guard.header_timeout_s, self._expire)

    def cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if self.requests == 0 and self._transport is not None:
            self._guard.timed_out += 1
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self._inner is None else self._inner.eof_received()

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.cancel_deadline()
        if self._inner is None:
            return
        if self._transport is not None:
            self._guard.open.pop(self._transport, None)
        self._inner.connection_lost(exc)


class ConnectionGuard:
    """Bounds the connections of one aiohttp server: how many, and how long each may
    wait for a request's head. :meth:`protocol` is the factory to serve with and
    :meth:`middleware` goes into the app."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], *,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {max_connections}")
        if not 0 < header_timeout_s <= 3_600:  # also refuses NaN
            raise ValueError("header_timeout_s must be above 0 and at most 3600, not "
                             f"{header_timeout_s!r}")
        self.factory = factory
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.open: dict[asyncio.BaseTransport, _Guarded] = {}
        self.refused = 0  # connections answered 503 at once: over the limit
        self.timed_out = 0  # connections closed: no request head in time

    def protocol(self) -> asyncio.Protocol:
        return _Guarded(self)

    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[Any]]) -> Any:
        """Holds the connection's deadline while a request is in progress (its head is
        in), and starts it again once its handler is done."""
        guarded = self.open.get(request.transport) if request.transport else None
        if guarded is None:
            return await handler(request)
        guarded.requests += 1
        guarded.cancel_deadline()
        try:
            return await handler(request)
        finally:
            guarded.requests -= 1
            if guarded.requests == 0:
                guarded.wait_for_request()
