"""The scheduler service end to end: `tickwheel serve` started on a fresh data
directory, a receiver for its webhook, and work submitted with the client: "cancel
this order in 3 seconds unless it is paid", an order that is paid in time, and a
schedule every 2 seconds, read back while it runs, then paused.

    python examples/service_with_client.py
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tickwheel.client import Client

sys.path.insert(0, str(Path(__file__).parent))
from webhook_receiver import Receiver, serve


def _start(data: Path, hook: str) -> tuple[subprocess.Popen[str], str]:
    child = subprocess.Popen([sys.executable, "-m", "tickwheel.cli", "serve", "--data",
                              str(data), "--listen", "127.0.0.1:0", "--deliver-to", hook],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert child.stdout is not None
    for line in child.stdout:
        found = re.search(r"taking rows at (http://\S+)/v1/events", line)
        if found:
            threading.Thread(target=child.stdout.read, daemon=True).start()
            return child, found.group(1)
    raise SystemExit(f"the service did not start: {child.wait()}")


def main() -> None:
    receiver = Receiver()
    hooks = serve(receiver, quiet=True)
    threading.Thread(target=hooks.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{hooks.server_address[1]}/hook"
    with tempfile.TemporaryDirectory(prefix="tickwheel-example-") as tmp:
        child, url = _start(Path(tmp) / "data", hook)
        try:
            with Client(url) as client:
                client.wait_ready(timeout_s=60)
                now = int(time.time() * 1000)
                client.schedule_at("order-17", now + 3_000)   # never paid: expires
                client.schedule_at("order-18", now + 3_000)
                client.cancel("order-18")                     # paid in time
                accepted = client.schedule("heartbeat", {"every_ms": 2_000})
                client.wait_applied(accepted.ts_ms)
                print("upcoming heartbeats:", client.get_schedule("heartbeat")["upcoming"][:3])
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and not any(
                        o["op_id"] == "order-17" for o in receiver.outcomes):
                    time.sleep(0.1)
                paused = client.pause("heartbeat")
                client.wait_applied(paused.ts_ms)
                print("heartbeat is", client.get_schedule("heartbeat")["state"])
        finally:
            child.send_signal(signal.SIGTERM)
            child.wait(timeout=60)
            hooks.shutdown()
    for outcome in receiver.outcomes:
        print(f"{outcome['outcome']:>9}  {outcome['op_id']}")
    print(f"{len(receiver.outcomes)} outcomes, {receiver.duplicates} duplicates dropped")


if __name__ == "__main__":
    main()
