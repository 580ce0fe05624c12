"""The ``tickwheel`` command (``pip install 'tickwheel[cli]'``).

Exit codes: 0 success, 1 the work failed, 2 bad arguments (as click does).
"""

from __future__ import annotations

import io
import sys

try:
    import rich  # noqa: F401
    import typer  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise SystemExit("the tickwheel command needs its extra: pip install 'tickwheel[cli]'") \
        from exc

# Each command module adds its command to the app, in this order in --help.
# isort: off
from tickwheel.cli import (  # noqa: F401
    generate, run, serve, schedules, ops, redeliver, report, submit,
)
# isort: on
from tickwheel.cli._app import app

__all__ = ["app", "main"]


def main() -> None:
    # A path holding a byte that is not UTF-8 reaches Python as a surrogate; under a
    # UTF-8 locale printing it would fail the command at its last line. It is written
    # back as the byte it was, as ls does.
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="surrogateescape")
    app()
