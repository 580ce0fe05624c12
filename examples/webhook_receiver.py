"""A webhook receiver for `tickwheel serve --deliver-to`: it takes each request's
outcomes and drops those it has seen by their ``id``, since delivery is at least once
(a request is sent again after a timeout or a restart, with the same ids).

    python examples/webhook_receiver.py [--port 9000]
    tickwheel serve --deliver-to http://127.0.0.1:9000/hook

It answers 200 once it has taken a request; a 5xx or 429 would have the service send it
again later, and another 4xx puts it in the service's dead letters. A real receiver
keeps the ids it has seen where it keeps its work (a database table with a unique key),
not in memory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY_BYTES = 16 << 20


class Receiver:
    """Outcomes taken once each, by id; thread-safe."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.outcomes: list[dict[str, Any]] = []
        self.duplicates = 0
        self._lock = threading.Lock()

    def take(self, outcomes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The outcomes not seen before, now seen."""
        new = []
        with self._lock:
            for outcome in outcomes:
                if outcome["id"] in self.seen:
                    self.duplicates += 1
                    continue
                self.seen.add(outcome["id"])
                self.outcomes.append(outcome)
                new.append(outcome)
        return new


def serve(receiver: Receiver, port: int = 0, quiet: bool = False) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 that hands each request's outcomes to ``receiver``;
    run it with ``serve_forever()``."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_BODY_BYTES:
                self.send_error(413 if length else 411)
                return
            try:
                outcomes = json.loads(self.rfile.read(length))["outcomes"]
            except (ValueError, KeyError, TypeError):
                self.send_error(400, "not a batch of outcomes")
                return
            for outcome in receiver.take(outcomes):
                if not quiet:
                    print(f"{outcome['outcome']:>9}  {outcome['op_id']}", flush=True)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per outcome above, not one per request

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9000)
    args = parser.parse_args()
    server = serve(Receiver(), args.port)
    print(f"taking outcomes at http://127.0.0.1:{server.server_address[1]}/hook", flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C stops it
        server.serve_forever()


if __name__ == "__main__":
    main()
