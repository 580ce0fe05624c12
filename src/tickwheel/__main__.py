"""``python -m tickwheel``: the version, and whether the core is compiled.

pip hides a build's output, so this is where a user sees which build they got.
"""

from __future__ import annotations

import sys

import tickwheel
from tickwheel import _mutex

__all__ = ["main"]


def main() -> int:
    print(f"tickwheel {tickwheel.__version__} on Python {sys.version.split()[0]}")
    if tickwheel.compiled:
        print("core: compiled (mypyc)")
    else:
        print("core: pure Python (no C compiler at install, or TICKWHEEL_PURE_PYTHON=1); "
              "reinstall where a C compiler exists for the compiled core")
    if isinstance(_mutex.new_lock(), _mutex.Mutex):
        lock = "RawLock (C)" if _mutex.native else "the token lock (queue.SimpleQueue)"
    else:
        lock = "threading.Lock"
    print(f"mutex: {lock}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
