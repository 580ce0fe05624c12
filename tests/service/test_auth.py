"""Tokens: beyond loopback the service needs one; every endpoint checks it before it
reads a body; clients and the submit command send it."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("aiohttp")

from typer.testing import CliRunner

from tickwheel.cli import app
from tickwheel.client import Client, SubmitError
from tickwheel.service.auth import TokenError, authorized, is_loopback, read_token
from tickwheel.service.server import SubmitServer

TOKEN = "s3cret-token-0123456789"
ROW = json.dumps({"type": "cancel", "op_id": "a"})


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SubmitServer]:
    with SubmitServer(tmp_path / "in", tmp_path / "state", clock=lambda: 1_000,
                      token=TOKEN, max_body_bytes=1_000) as running:
        yield running


def test_a_request_without_the_token_is_answered_401_and_nothing_is_written(
        server: SubmitServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"},
                    {"Authorization": f"Basic {TOKEN}"}, {"Authorization": TOKEN}):
        answer = httpx.post(f"{server.url}/v1/events", content=ROW, headers=headers)
        assert answer.status_code == 401, headers
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    # Before the body is looked at: a body over the limit is still a 401, not a 413.
    assert httpx.post(f"{server.url}/v1/events", content=b"x" * 5_000).status_code == 401
    for path in ("/v1/status", "/metrics"):
        assert httpx.get(f"{server.url}{path}").status_code == 401
    assert list(server.input_dir.glob("submit-*")) == []
    assert server.stats().refused_unauthorized == 7
    assert TOKEN not in caplog.text


def test_a_request_with_the_token_is_taken(server: SubmitServer) -> None:
    answer = httpx.post(f"{server.url}/v1/events", content=ROW,
                        headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200
    with Client(server.url, token=TOKEN) as client:
        assert client.cancel("b").accepted == 1
        assert client.status()["intake"]["accepted_rows"] == 2
    with Client(server.url, retries=3) as client, \
            pytest.raises(SubmitError, match="401") as refused:
        client.cancel("c")
    assert refused.value.status == 401  # not retried: a token does not come by waiting


def test_the_submit_command_sends_the_token(server: SubmitServer, tmp_path: Path) -> None:
    rows, token_file = tmp_path / "rows.jsonl", tmp_path / "token"
    rows.write_text(ROW + "\n")
    token_file.write_text(TOKEN + "\n")
    refused = CliRunner().invoke(app, ["submit", server.url, str(rows)])
    assert refused.exit_code == 1 and "401" in refused.output
    taken = CliRunner().invoke(app, ["submit", server.url, str(rows), "--token-file",
                                     str(token_file)])
    assert taken.exit_code == 0, taken.output
    assert TOKEN not in taken.output


def test_token_files_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(f"  {TOKEN}\n")
    assert read_token(path) == TOKEN
    for bad in ("", "short", "has a space in it 0123456789", "é" * 20, "x" * 5_000):
        path.write_text(bad)
        with pytest.raises(TokenError) as error:
            read_token(path)
        assert bad not in str(error.value) or not bad
    link = tmp_path / "link"
    path.write_text(TOKEN)
    link.symlink_to(path)
    with pytest.raises(TokenError, match="cannot be read"):
        read_token(link)
    with pytest.raises(TokenError, match="cannot be read"):
        read_token(tmp_path / "missing")


def test_the_comparison_takes_only_a_bearer_token() -> None:
    assert authorized(f"Bearer {TOKEN}", TOKEN)
    assert authorized(f"bearer {TOKEN}", TOKEN)
    assert not authorized(None, TOKEN)
    assert not authorized(f"Bearer {TOKEN}x", TOKEN)
    assert not authorized("Bearer \udcff", TOKEN)  # a header that is not ASCII


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.9.9.9", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("0.0.0.0", False), ("::", False), ("10.0.0.5", False),
    ("example.com", False)])
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_listening_beyond_loopback_needs_a_token_or_insecure_no_auth(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    base = ["run", "--follow", "--clock", "wall", "--input", str(tmp_path / "in"),
            "--output", str(tmp_path / "out")]
    refused = CliRunner().invoke(app, [*base, "--listen", "0.0.0.0:0"])
    assert refused.exit_code == 2
    assert "--listen 0.0.0.0:0 is beyond loopback" in refused.output
    assert "--token-file" in refused.output and "--insecure-no-auth" in refused.output
    (tmp_path / "token").write_text("short")
    bad = CliRunner().invoke(app, [*base, "--listen", "0.0.0.0:0", "--token-file",
                                   str(tmp_path / "token")])
    assert bad.exit_code == 2 and "--token-file" in bad.output
    alone = CliRunner().invoke(app, [*base, "--token-file", str(tmp_path / "token")])
    assert alone.exit_code == 2 and "applies to --listen only" in alone.output
    assert not (tmp_path / "out").exists()
    assert os.listdir(tmp_path / "in") == []
