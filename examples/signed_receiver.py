"""A webhook receiver for a target with a ``secret_file``: it verifies each request's
Standard Webhooks signature with the ``standardwebhooks`` package and drops the outcomes
it has seen by their ``id`` (delivery is at least once).

    python examples/signed_receiver.py --secret-file coupons.key [--port 9001]

with a targets file such as::

    [targets.coupons]
    urls = ["http://127.0.0.1:9001/hook"]
    secret_file = "coupons.key"

A request whose signature does not verify (another sender, a tampered body, a replay
more than five minutes old) is answered 401 and taken nowhere: the service sends a
request again on 5xx only, so a 401 puts it in that target's dead letters, where
``tickwheel redeliver`` finds it once the secrets agree again.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

MAX_BODY_BYTES = 16 << 20


class SignedReceiver:
    """Outcomes of verified requests, each taken once by id; thread-safe."""

    def __init__(self, secret: str) -> None:
        self.webhook = Webhook(secret)
        self.seen: set[str] = set()
        self.outcomes: list[dict[str, Any]] = []
        self.refused = 0
        self._lock = threading.Lock()

    def take(self, body: bytes, headers: dict[str, str]) -> list[dict[str, Any]] | None:
        """The new outcomes of a request; None if its signature does not verify."""
        try:
            request = self.webhook.verify(body, headers)
        except WebhookVerificationError:
            with self._lock:
                self.refused += 1
            return None
        with self._lock:
            new = [o for o in request["outcomes"] if o["id"] not in self.seen]
            self.seen.update(o["id"] for o in new)
            self.outcomes += new
        return new


def serve(receiver: SignedReceiver, port: int = 0, quiet: bool = False) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 for ``receiver``; run it with ``serve_forever()``."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_BODY_BYTES:
                self.send_error(413 if length else 411)
                return
            headers = {name.lower(): value for name, value in self.headers.items()}
            new = receiver.take(self.rfile.read(length), headers)
            if new is None:
                self.send_error(401, "the signature does not verify")
                return
            for outcome in new:
                if not quiet:
                    print(f"{outcome['outcome']:>9}  {outcome['op_id']}  "
                          f"{outcome.get('payload')}", flush=True)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secret-file", type=Path, required=True)
    parser.add_argument("--port", type=int, default=9001)
    args = parser.parse_args()
    receiver = SignedReceiver(args.secret_file.read_text().strip())
    server = serve(receiver, args.port)
    print(f"taking signed outcomes at http://127.0.0.1:{server.server_address[1]}/hook",
          flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
