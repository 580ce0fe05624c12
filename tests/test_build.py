"""The compiled core and the pure-Python sources behave the same."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import tickwheel
import tickwheel._mutex

ROOT = Path(__file__).resolve().parents[1]


def _have_c_compiler() -> bool:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shutil.which(shlex.split(cc)[0]) is not None


@pytest.mark.skipif(os.environ.get("TICKWHEEL_PURE_PYTHON") == "1" or not _have_c_compiler(),
                    reason="the compiled core is built only where a C compiler exists")
def test_the_install_uses_the_compiled_core_where_a_compiler_exists() -> None:
    # A silent fallback to pure Python would cost 3-5x in speed; make it loud.
    assert tickwheel.compiled is True
    assert tickwheel._mutex.native is True  # the C lock is built with the core
    # ... and the module that hides a running loop's pending handles from the collector
    assert importlib.util.find_spec("tickwheel.aio._gc") is not None


def test_no_compiled_module_is_older_than_its_source() -> None:
    # An edited source next to an old extension would silently run the old code.
    stale = []
    for ext in (ROOT / "src" / "tickwheel").rglob("*.so"):
        for suffix in (".py", ".c"):
            source = ext.parent / (ext.name.split(".")[0] + suffix)
            if source.exists() and source.stat().st_mtime > ext.stat().st_mtime:
                stale.append(source.relative_to(ROOT))
    assert not stale, f"rebuild the compiled core (make test does): {stale}"


@pytest.mark.slow
def test_the_pure_python_sources_pass_the_timer_and_resolver_specifications(
        tmp_path: Path) -> None:
    pure = tmp_path / "pure"
    shutil.copytree(ROOT / "src" / "tickwheel", pure / "tickwheel",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    env = {**os.environ, "PYTHONPATH": f"{pure}{os.pathsep}{ROOT}"}
    flag = subprocess.run(
        [sys.executable, "-c", "import tickwheel; print(tickwheel.compiled, tickwheel.__file__)"],
        env=env, capture_output=True, text=True, check=True, cwd=tmp_path,
    ).stdout.split()
    assert flag[0] == "False" and flag[1].startswith(str(pure))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(ROOT / "tests" / "timers"), str(ROOT / "tests" / "test_clock.py"),
         str(ROOT / "tests" / "test_mutex.py"),
         *(str(ROOT / "tests" / "pipeline" / name) for name in (
             "test_reference.py", "test_resolver.py", "test_partitioned.py")),
         # Spilling is pure Python in both builds, and measuring its memory under
         # tracemalloc is slow: the compiled run covers it.
         "-k", "not sorted_on_disk"],
        env=env, capture_output=True, text=True, cwd=ROOT, timeout=600, check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
