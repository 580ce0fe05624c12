"""Build hook: compile the timer core with mypyc where a C compiler exists.

The same sources run as pure Python without one (or with TICKWHEEL_PURE_PYTHON=1);
``tickwheel.compiled`` says which is in use. A failed compile installs no extension at
all, leaving the pure-Python package working instead of failing the install.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class _AllOrNothingBuildExt(build_ext):
    """The compiled modules are shims around one shared library: if any of them fails
    to build, install none, and the pure-Python sources are used instead."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # a compiler error, a missing header, ...
            print(f"tickwheel: compiling the core failed ({exc}); using pure Python",
                  file=sys.stderr)
            for ext in self.extensions:
                for path in (self.get_ext_fullpath(ext.name),):
                    if os.path.exists(path):
                        os.remove(path)
            self.extensions = []

CORE = [
    "src/tickwheel/_clock.py",
    "src/tickwheel/_validate.py",
    "src/tickwheel/_histogram.py",
    "src/tickwheel/_mutex.py",
    "src/tickwheel/timers/_task.py",
    "src/tickwheel/timers/_bucket.py",
    "src/tickwheel/timers/_wheel.py",
    "src/tickwheel/timers/_base.py",
    "src/tickwheel/timers/_timing_wheel.py",
    "src/tickwheel/timers/_hashed_wheel.py",
    "src/tickwheel/timers/_heap.py",
    "src/tickwheel/purgatory/_operation.py",
    "src/tickwheel/purgatory/_watchers.py",
    "src/tickwheel/purgatory/_purgatory.py",
    "src/tickwheel/pipeline/events.py",
    "src/tickwheel/pipeline/resolver.py",
    "src/tickwheel/pipeline/shard.py",
]


def _have_c_compiler() -> bool:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shutil.which(shlex.split(cc)[0]) is not None


def _ext_modules() -> list[object]:
    if os.environ.get("TICKWHEEL_PURE_PYTHON") == "1":
        print("tickwheel: TICKWHEEL_PURE_PYTHON=1, building pure Python", file=sys.stderr)
        return []
    if not _have_c_compiler():
        print("tickwheel: no C compiler found, building pure Python", file=sys.stderr)
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("tickwheel: mypyc not installed, building pure Python", file=sys.stderr)
        return []
    try:
        extensions = mypycify(CORE, opt_level="3", debug_level="0",
                              group_name="tickwheel._core")
    except (Exception, SystemExit) as exc:  # mypyc reports compile errors via SystemExit
        print(f"tickwheel: mypyc failed ({exc!r}), building pure Python", file=sys.stderr)
        return []
    # The lock the compiled core takes on every schedule and cancel (see _rawlock.c).
    rawlock = Extension("tickwheel._rawlock", ["src/tickwheel/_rawlock.c"])
    return [*extensions, rawlock]


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": _AllOrNothingBuildExt})
