"""Targets: a targets file read strictly, requests signed by Standard Webhooks, failover
and round robin over a target's urls, max_attempts then the dead letter, a dispatcher
per target, and ``tickwheel redeliver``. Loopback only."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.conftest import eventually
from tests.service.receiver import receiving
from tickwheel import ProcessingResult
from tickwheel.pipeline.contract.events import OutcomeKind
from tickwheel.pipeline.contract.outcomes import OutcomeRow
from tickwheel.pipeline.delivery.sink import OutcomeSink
from tickwheel.service.outbox import Outbox
from tickwheel.service.signing import SigningKey
from tickwheel.service.targets import TargetsError, TargetSpec, load_targets
from tickwheel.service.webhook import WebhookProcessor

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
ROWS = [OutcomeRow(f"op-{i}", OutcomeKind.EXPIRED, 1_000 + i, 900, (), None,
                   target="coupons", payload='{"coupon":"SAVE10"}') for i in range(3)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def targets_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "targets.toml"
    path.write_text(text)
    return path


# -- the targets file ------------------------------------------------------------------


def test_a_targets_file_defines_each_target_with_its_knobs(tmp_path: Path) -> None:
    (tmp_path / "coupons.key").write_text(SECRET + "\n")
    defined = load_targets(targets_file(tmp_path, """
[targets.coupons]
urls = ["http://10.0.0.5:9001/hook", "http://10.0.0.6:9001/hook"]
strategy = "round_robin"
secret_file = "coupons.key"
headers = { "X-Team" = "growth" }
timeout_ms = 2000
max_attempts = 8
max_batch = 1

[targets.default]
urls = ["https://example.com/hook"]
"""))
    coupons = defined["coupons"]
    assert coupons.urls == ("http://10.0.0.5:9001/hook", "http://10.0.0.6:9001/hook")
    assert (coupons.strategy, coupons.timeout_ms, coupons.max_attempts, coupons.max_batch) \
        == ("round_robin", 2000, 8, 1)
    assert dict(coupons.headers) == {"X-Team": "growth"}
    assert coupons.signing_key is not None and SECRET not in repr(coupons)
    default = defined["default"]
    assert (default.strategy, default.max_attempts, default.signing_key) == ("failover", 0,
                                                                             None)


@pytest.mark.parametrize(("text", "named"), [
    ("[targets.a]\nurls = ['http://x/']\nretries = 3\n", "targets.a.retries"),
    ("[targets.a]\nurls = ['ftp://x/']\n", "targets.a.urls"),
    ("[targets.a]\nurls = []\n", "targets.a.urls"),
    ("[targets.a]\nurls = ['http://x/']\nsecret_file = 'missing.key'\n",
     "targets.a.secret_file"),
    ("[targets.a]\nurls = ['http://x/']\nstrategy = 'random'\n", "targets.a.strategy"),
    ("[targets.a]\nurls = ['http://x/']\nmax_attempts = -1\n", "targets.a.max_attempts"),
    ("[targets.a]\nurls = ['http://x/']\nheaders = { 'webhook-id' = 'x' }\n",
     "targets.a.headers"),
    ("[targets.'../up']\nurls = ['http://x/']\n", "targets.../up"),
    ("[targets.a\nurls = 1\n", "is not TOML"),
    ("[other]\nx = 1\n", "unknown key 'other'"),
])
def test_a_malformed_targets_file_is_refused_naming_the_key(tmp_path: Path, text: str,
                                                           named: str) -> None:
    with pytest.raises(TargetsError, match=named.replace(".", r"\.").replace("'", ".")):
        load_targets(targets_file(tmp_path, text))


def test_a_secret_that_is_not_one_is_refused_without_showing_it(tmp_path: Path) -> None:
    (tmp_path / "bad.key").write_text("whsec_not base64!")
    with pytest.raises(TargetsError, match="secret_file") as refused:
        load_targets(targets_file(tmp_path, "[targets.a]\nurls = ['http://x/']\n"
                                            "secret_file = 'bad.key'\n"))
    assert "not base64!" not in str(refused.value)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tickwheel.cli", *args], check=False,
                          capture_output=True, text=True, timeout=300)


def test_the_command_refuses_a_bad_targets_file_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    path = targets_file(tmp_path, "[targets.a]\nurls = ['http://x/']\ntimeout = 5\n")
    done = _cli("run", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                "--targets", str(path))
    assert done.returncode == 2 and "targets.a.timeout" in done.stdout
    both = targets_file(tmp_path, "[targets.default]\nurls = ['http://x/']\n")
    done = _cli("run", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                "--targets", str(both), "--deliver-to", "http://127.0.0.1:9/")
    assert done.returncode == 2 and "give one" in done.stdout
    assert not (tmp_path / "out").exists()


# -- signed requests -------------------------------------------------------------------


def test_a_signed_request_verifies_with_the_standard_webhooks_library(tmp_path: Path) -> None:
    with receiving(lambda n: 500 if n == 0 else 200) as receiver:
        spec = TargetSpec("coupons", (receiver.url,), signing_key=SigningKey(SECRET))
        webhook = WebhookProcessor(spec, tmp_path)
        assert webhook.process_batch(ROWS) is ProcessingResult.TRANSIENT_ERROR
        assert webhook.process_batch(ROWS) is ProcessingResult.SUCCESS
        webhook.close()
    (first_headers, first), (headers, body) = receiver.raw
    verified = Webhook(SECRET).verify(body, headers)
    assert [o["payload"] for o in verified["outcomes"]] == [{"coupon": "SAVE10"}] * 3
    assert [o["target"] for o in verified["outcomes"]] == ["coupons"] * 3
    assert first_headers["webhook-id"] == headers["webhook-id"]  # a retry: the same id
    assert first == body
    tampered = body.replace(b"SAVE10", b"SAVE99")
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(tampered, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + base64.b64encode(b"x" * 32).decode()).verify(body, headers)


def test_a_request_without_a_secret_carries_no_signature(tmp_path: Path) -> None:
    with receiving(lambda _n: 200) as receiver:
        spec = TargetSpec("t", (receiver.url,), headers={"X-Team": "growth"})
        webhook = WebhookProcessor(spec, tmp_path)
        assert webhook.process_batch(ROWS) is ProcessingResult.SUCCESS
        webhook.close()
    ((headers, _),) = receiver.raw
    assert not {"webhook-id", "webhook-signature", "webhook-timestamp"} & set(headers)
    assert headers["x-team"] == "growth"


# -- urls, attempts and dead letters ---------------------------------------------------


def test_failover_moves_past_a_url_that_refuses_connections_and_stays_past_it(
        tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/hook"
    with receiving(lambda _n: 200) as receiver:
        webhook = WebhookProcessor(TargetSpec("t", (dead, receiver.url)), tmp_path)
        assert webhook.process_batch(ROWS[:1]) is ProcessingResult.SUCCESS
        assert webhook.process_batch(ROWS[1:]) is ProcessingResult.SUCCESS
        webhook.close()
    assert len(receiver.requests) == 2
    assert webhook.stats().delivered == 3 and webhook.stats().failed == 0


def test_failover_moves_past_a_url_that_answers_5xx(tmp_path: Path) -> None:
    with receiving(lambda _n: 502) as broken, receiving(lambda _n: 200) as working:
        webhook = WebhookProcessor(TargetSpec("t", (broken.url, working.url)), tmp_path)
        assert webhook.process_batch(ROWS) is ProcessingResult.SUCCESS
        webhook.close()
    assert len(broken.requests) == 1 and len(working.requests) == 1


def test_round_robin_spreads_requests_over_the_urls(tmp_path: Path) -> None:
    with receiving(lambda _n: 200) as one, receiving(lambda _n: 200) as two:
        webhook = WebhookProcessor(TargetSpec("t", (one.url, two.url), "round_robin"),
                                   tmp_path)
        for row in ROWS + ROWS[:1]:
            assert webhook.process_batch([row]) is ProcessingResult.SUCCESS
        webhook.close()
    assert len(one.requests) == 2 and len(two.requests) == 2


def test_a_target_that_always_answers_500_gets_max_attempts_then_a_dead_letter(
        tmp_path: Path) -> None:
    with receiving(lambda _n: 500) as receiver:
        spec = TargetSpec("coupons", (receiver.url,), max_attempts=3, retry_ms=10)
        webhook = WebhookProcessor(spec, tmp_path / "dead-letter" / "coupons")
        with OutcomeSink(webhook, max_batch_size=10, network_failure_retry_ms=10) as sink:
            sink.deliver(ROWS)
            assert sink.flush(timeout_s=60)
        webhook.close()
        time.sleep(0.2)  # nothing more comes: the request went to its dead letter
        assert len(receiver.requests) == 3
    (letter,) = (tmp_path / "dead-letter" / "coupons").glob("*.json")
    record = json.loads(letter.read_text())
    assert (record["status"], record["attempts"], record["target"]) == (500, 3, "coupons")
    assert [o["op_id"] for o in record["request"]["outcomes"]] == ["op-0", "op-1", "op-2"]
    stats = webhook.stats()
    assert (stats.dead_letters, stats.failed, stats.retried) == (3, 9, 6)


def test_a_hanging_target_never_holds_up_another(tmp_path: Path) -> None:
    with receiving(lambda _n: 200, delay_s=5.0) as hanging, \
            receiving(lambda _n: 200) as quick:
        outbox = Outbox.for_targets({
            "slow": TargetSpec("slow", (hanging.url,), timeout_ms=60_000, max_batch=1),
            "fast": TargetSpec("fast", (quick.url,))}, tmp_path)
        rows = [OutcomeRow(f"{name}-{i}", OutcomeKind.EXPIRED, i, 0, (), None, target=name)
                for i in range(40) for name in ("slow", "fast")]
        started = time.monotonic()
        assert isinstance(outbox.sink, dict)
        for name, sink in outbox.sink.items():
            sink.deliver([row for row in rows if row.target == name])
        assert eventually(lambda: len(quick.ids()) == 40, 30)
        assert time.monotonic() - started < 4  # not behind a single 5 s answer
        assert not any(o["op_id"].startswith("fast") for r in hanging.requests
                       for o in r["outcomes"])
        outbox.close(timeout_s=0.5)


def test_an_outcome_naming_an_undefined_target_goes_to_its_dead_letters(
        tmp_path: Path) -> None:
    with receiving(lambda _n: 200) as receiver:
        outbox = Outbox.for_targets({"a": TargetSpec("a", (receiver.url,))}, tmp_path)
        rows = [OutcomeRow("x", OutcomeKind.EXPIRED, 5, 0, (), None, target="nope")]
        deliveries = outbox.deliver(rows)
        outbox.close()
    assert deliveries["*"].stats.dropped == 1 and receiver.requests == []
    (letter,) = (tmp_path / "dead-letter" / "nope").glob("*.json")
    assert "no target 'nope'" in json.loads(letter.read_text())["answer"]
    assert outbox.status()["unknown_target_outcomes"] == 1


def test_redeliver_sends_a_targets_dead_letters_again_and_removes_those_taken(
        tmp_path: Path) -> None:
    with receiving(lambda _n: 400) as refusing:
        webhook = WebhookProcessor(TargetSpec("coupons", (refusing.url,)),
                                   tmp_path / "dead-letter" / "coupons")
        assert webhook.process_batch(ROWS) is ProcessingResult.PERMANENT_ERROR
        assert webhook.process_batch(ROWS[:1]) is ProcessingResult.PERMANENT_ERROR
        webhook.close()
    (tmp_path / "coupons.key").write_text(SECRET)
    with receiving(lambda n: 200 if n == 0 else 503) as receiver:
        path = targets_file(tmp_path, f"[targets.coupons]\nurls = ['{receiver.url}']\n"
                                      "secret_file = 'coupons.key'\n")
        done = _cli("redeliver", str(tmp_path), "--target", "coupons", "--targets", str(path))
    assert done.returncode == 1, done.stdout + done.stderr  # one taken, one kept
    assert "redelivered 1 requests" in done.stdout
    assert len(list((tmp_path / "dead-letter" / "coupons").glob("*.json"))) == 1
    headers, body = receiver.raw[0]
    Webhook(SECRET).verify(body, headers)  # signed as the target signs
    sent = {o["id"] for r in receiver.requests[:1] for o in r["outcomes"]}
    assert sent <= {f"op:op-{i}@{100 + i}" for i in range(3)}
    missing = _cli("redeliver", str(tmp_path), "--target", "nope", "--targets", str(path))
    assert missing.returncode == 2 and "no target 'nope'" in missing.stdout
    outside = _cli("redeliver", str(tmp_path), "--target", "../coupons")
    assert outside.returncode == 2 and "not a target's name" in outside.stdout


def test_rows_naming_no_target_go_to_the_default_and_each_named_one_to_its_own(
        tmp_path: Path) -> None:
    with receiving(lambda _n: 200) as default, receiving(lambda _n: 200) as coupons:
        outbox = Outbox.for_targets({"default": TargetSpec("default", (default.url,)),
                                     "coupons": TargetSpec("coupons", (coupons.url,))},
                                    tmp_path)
        rows = [OutcomeRow(f"op-{i}", OutcomeKind.EXPIRED, i, 0, (), None,
                           target=None if i % 2 else "coupons") for i in range(10)]
        deliveries = outbox.deliver(rows)
        outbox.close()
    assert {name: d.stats.tasks.get("success", 0) for name, d in deliveries.items()} == {
        "default": 5, "coupons": 5}
    assert {o["op_id"] for r in default.requests for o in r["outcomes"]} == {
        f"op-{i}" for i in range(1, 10, 2)}
    assert {o["op_id"] for r in coupons.requests for o in r["outcomes"]} == {
        f"op-{i}" for i in range(0, 10, 2)}
    assert outbox.targets == {"default", "coupons"}
    assert {name: stats.delivered for name, stats in outbox.stats().items()} == {
        "default": 5, "coupons": 5}


def test_redeliver_without_a_targets_file_sends_to_the_url_each_letter_names(
        tmp_path: Path) -> None:
    with receiving(lambda n: 400 if n == 0 else 200) as receiver:
        webhook = WebhookProcessor(TargetSpec("orders", (receiver.url,)),
                                   tmp_path / "dead-letter" / "orders")
        assert webhook.process_batch(ROWS) is ProcessingResult.PERMANENT_ERROR
        webhook.close()
        done = _cli("redeliver", str(tmp_path), "--target", "orders")
    assert done.returncode == 0, done.stdout + done.stderr
    assert receiver.requests[0] == receiver.requests[1]  # the same request, ids and all
    assert receiver.raw[0][0].get("webhook-id") is None  # unsigned, as it was
    assert list((tmp_path / "dead-letter" / "orders").glob("*.json")) == []
