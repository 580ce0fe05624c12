"""`tickwheel serve`: the service with no flags needed, all it keeps in one directory."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")

from typer.testing import CliRunner

from tests.service.conftest import service_url
from tickwheel.cli import app
from tickwheel.client import Client
from tickwheel.pipeline.engines.following import wall_clock_ms


def _serve(cwd: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    child = subprocess.Popen([sys.executable, "-m", "tickwheel.cli", "serve", *args],
                             cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    return child, service_url(child)


def test_serve_keeps_everything_in_its_data_directory(tmp_path: Path) -> None:
    child, url = _serve(tmp_path, "--listen", "127.0.0.1:0")
    try:
        with Client(url) as client:
            client.wait_ready(timeout_s=60)
            client.schedule_at("order-1", wall_clock_ms() + 100)
            status = client.status()
            assert status["ready"] is True
    finally:
        child.send_signal(signal.SIGTERM)
        output, _ = child.communicate(timeout=120)
    assert child.returncode == 0, output
    data = tmp_path / "tickwheel-data"
    assert sorted(os.listdir(data)) == ["input", "outputs"]
    assert (data / "outputs" / "_checkpoint" / "submit").is_dir()
    assert list((data / "input").glob("submit-*.jsonl"))


def test_serve_on_an_address_in_use_exits_2_naming_listen_before_any_batch(
        tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["serve", "--data", str(tmp_path / "d"),
                                          "--listen", f"127.0.0.1:{port}"])
    assert result.exit_code == 2, result.output
    assert f"--listen 127.0.0.1:{port}: cannot serve there" in result.output
    assert not list((tmp_path / "d" / "outputs").glob("outcomes/batch-*"))


def test_serve_refuses_what_it_cannot_use_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    not_dir = CliRunner().invoke(app, ["serve", "--data", str(tmp_path / "file")])
    assert not_dir.exit_code == 2 and "not a directory" in not_dir.output
    open_port = CliRunner().invoke(app, ["serve", "--data", str(tmp_path / "d"),
                                         "--listen", "0.0.0.0:0"])
    assert open_port.exit_code == 2 and "--token-file" in open_port.output
    assert not (tmp_path / "d").exists()  # refused before the directory was made
    memory = CliRunner().invoke(app, ["serve", "--data", str(tmp_path / "d"),
                                      "--driver-memory", "lots"])
    assert memory.exit_code == 2
