"""``python -m tickwheel``: the version, and whether the core is compiled.

pip hides a build's output, so this is where a user sees which build they got.
"""

from __future__ import annotations

import tickwheel

__all__ = ["main"]


def main() -> int:
    for line in tickwheel._build_lines():
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
