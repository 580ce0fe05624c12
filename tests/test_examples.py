"""The programs in examples/ run and say what they are for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(*args: str, cwd: Path | None = None, env_path: str | None = None) -> str:
    import os

    env = dict(os.environ)
    if env_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env_path, env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=env, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_recurring_schedules_follow_their_zones_across_a_clock_change() -> None:
    out = _run(str(EXAMPLES / "recurring_schedule.py"), "--days", "3")
    assert "Sat 2026-03-28 09:00 UTC  coupons" in out  # 09:00 GMT
    assert "Sun 2026-03-29 08:00 UTC  coupons" in out  # 09:00 BST
    assert out.count("earnings") == 3 and "18:00 UTC  earnings" in out


def test_expired_sessions_are_each_dispatched_once() -> None:
    out = _run(str(EXAMPLES / "expired_sessions.py"), "--members", "200", "--seconds", "30")
    assert "every expiry delivered exactly once" in out
    assert "sessions expired 0," not in out


def test_idle_connections_time_out() -> None:
    out = _run(str(EXAMPLES / "idle_timeouts.py"), "--connections", "50", "--idle", "0.5")
    assert "every idle connection was closed by its timeout, none early" in out


def test_a_processor_gets_every_outcome_of_a_run(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    _run("-m", "tickwheel.cli", "generate", "--events", "5000", "--output", "events",
         cwd=tmp_path)
    out = _run("-m", "tickwheel.cli", "run", "--input", "events", "--output", "out",
               "--processor", "outcome_processor:CountByOutcome", cwd=tmp_path,
               env_path=str(EXAMPLES))
    assert "outcomes by kind: {'cancelled':" in out
    assert "0 refused by the processor" in out


@pytest.mark.slow
def test_the_service_example_runs_end_to_end() -> None:
    pytest.importorskip("aiohttp")
    out = _run(str(EXAMPLES / "service_with_client.py"))
    assert "heartbeat is paused" in out
    assert "expired  order-17" in out and "cancelled  order-18" in out
    assert "fired  heartbeat@" in out


def test_the_signed_receiver_takes_signed_requests_once_and_refuses_tampered_ones(
        tmp_path: Path) -> None:
    pytest.importorskip("standardwebhooks")
    import base64
    import threading

    import httpx

    from tickwheel.pipeline.contract.events import OutcomeKind
    from tickwheel.pipeline.contract.outcomes import OutcomeRow
    from tickwheel.service.signing import SigningKey
    from tickwheel.service.targets import TargetSpec
    from tickwheel.service.webhook import WebhookProcessor

    sys.path.insert(0, str(EXAMPLES))
    try:
        import signed_receiver
    finally:
        sys.path.remove(str(EXAMPLES))
    secret = "whsec_" + base64.b64encode(b"s" * 24).decode()
    receiver = signed_receiver.SignedReceiver(secret)
    server = signed_receiver.serve(receiver, quiet=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        webhook = WebhookProcessor(TargetSpec("t", (url,), signing_key=SigningKey(secret)),
                                   tmp_path)
        rows = [OutcomeRow("order-17", OutcomeKind.EXPIRED, 5, 4, (), None, payload="[1]")]
        for _ in range(2):  # delivered twice: taken once
            assert webhook.process_batch(rows).name == "SUCCESS"
        webhook.close()
        assert [o["op_id"] for o in receiver.outcomes] == ["order-17"]
        forged = httpx.post(url, content=b'{"outcomes": []}', headers={
            "webhook-id": "msg_1", "webhook-timestamp": "1", "webhook-signature": "v1,AAAA"})
        assert forged.status_code == 401 and receiver.refused == 1
    finally:
        server.shutdown()
        server.server_close()
