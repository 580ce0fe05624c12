"""A webhook receiver on loopback for the tests: answers from a script, keeps what it
was sent."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    def __init__(self, answer: Callable[[int], int], delay_s: float = 0.0) -> None:
        self.answer = answer  # request number -> HTTP status
        self.delay_s = delay_s
        self.requests: list[dict[str, Any]] = []
        self.statuses: list[int] = []
        #: Each request's headers (names in lower case) and body, as sent.
        self.raw: list[tuple[dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        self.url = ""

    def ids(self) -> set[str]:
        with self.lock:
            return {o["id"] for r, s in zip(self.requests, self.statuses, strict=True)
                    if 200 <= s < 300 for o in r["outcomes"]}


@contextmanager
def receiving(answer: Callable[[int], int], delay_s: float = 0.0) -> Iterator[Receiver]:
    receiver = Receiver(answer, delay_s)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            data = self.rfile.read(int(self.headers["content-length"]))
            body = json.loads(data)
            with receiver.lock:
                status = receiver.answer(len(receiver.requests))
                receiver.raw.append(({k.lower(): v for k, v in self.headers.items()}, data))
                receiver.requests.append(body)
                receiver.statuses.append(status)
            time.sleep(receiver.delay_s)
            self.send_response(status)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"no" if status >= 300 else b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
