"""Benchmarks: commands, not tests, kept beside the package rather than in it. Run
from the repository's root: ``python -m benchmarks --help`` (``make bench`` runs the
timers'). Their requirements (h11 for the service's load generator, croniter and
cronsim to compare against) are the development ones, ``requirements-dev.txt``."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["BENCHMARKS", "ROOT", "child_env"]

#: The benchmarks, as ``python -m benchmarks`` names them.
BENCHMARKS = ("timers", "asyncio", "purgatory", "dispatcher", "pipeline", "pending", "follow",
              "schedules", "service", "reads", "locks")
#: The repository's root, which a child process needs on its path to import them.
ROOT = Path(__file__).resolve().parent.parent


def child_env(first: str | None = None) -> dict[str, str]:
    """This process's environment for a child that runs ``-m benchmarks...``: the
    repository's root on ``PYTHONPATH`` (after ``first``, where given), wherever the
    child is started from."""
    paths = [first, str(ROOT), os.environ.get("PYTHONPATH")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
