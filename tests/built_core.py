"""Run by `make test` against the core a plain isolated `pip install .` built: where a C
compiler exists, the build must have compiled it (a silent fallback to pure Python would
cost 3-5x in speed)."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import sys
import sysconfig

import tickwheel
import tickwheel._mutex


def main() -> int:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    if shutil.which(shlex.split(cc)[0]) is None:
        print("core-built: no C compiler, the pure-Python core is tested")
        return 0
    missing = [what for what, ok in (
        ("the mypyc core", tickwheel.compiled),
        ("the C lock", tickwheel._mutex.native),
        ("aio._gc", importlib.util.find_spec("tickwheel.aio._gc") is not None)) if not ok]
    if missing:
        print(f"core-built: the isolated build did not compile {', '.join(missing)}",
              file=sys.stderr)
        return 1
    print(f"core-built: compiled for Python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
