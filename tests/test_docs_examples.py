"""Every Python example in the README and docs/ runs as written: a block that talks to
the service gets one started for it, its address in place of 127.0.0.1:8470."""

from __future__ import annotations

import contextlib
import io
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SERVICE = "http://127.0.0.1:8470"


def _blocks() -> list[tuple[str, int, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for n, block in enumerate(re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)):
            found.append((str(page.relative_to(ROOT)), n, block))
    return found


BLOCKS = _blocks()


def test_the_docs_hold_python_examples() -> None:
    assert len(BLOCKS) >= 9
    assert any(SERVICE in block for _, _, block in BLOCKS)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip("aiohttp")
    from tests.service.conftest import service_url

    home = tmp_path_factory.mktemp("docs-service")
    child = subprocess.Popen([sys.executable, "-m", "tickwheel.cli", "serve", "--listen",
                              "127.0.0.1:0"], cwd=home, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        yield service_url(child)
    finally:
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=120)


@pytest.mark.parametrize(
    "block",
    [pytest.param(block, id=f"{page}#{n}",
                  marks=[pytest.mark.slow] if SERVICE in block else [])
     for page, n, block in BLOCKS])
def test_an_example_runs_as_written(block: str, request: pytest.FixtureRequest,
                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if SERVICE in block:
        block = block.replace(SERVICE, request.getfixturevalue("service"))
    monkeypatch.chdir(tmp_path)  # whatever an example writes lands here
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(block, "<example>", "exec"), {"__name__": "__example__"})
