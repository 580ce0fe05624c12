"""Build hook: compile the timer core with mypyc where a C compiler exists.

Without a C compiler (or with TICKWHEEL_PURE_PYTHON=1) the same sources are installed
as pure Python; ``python -m tickwheel`` says which is in use. With a compiler, a
compile error fails the build with mypyc's or the compiler's message: a silent fallback
would hide a 3-5x slower install.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import sysconfig

from setuptools import Extension, setup



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
    "src/tickwheel/aio/_handle.py",
    "src/tickwheel/aio/_scheduler.py",
    "src/tickwheel/pipeline/contract/events.py",
    "src/tickwheel/pipeline/semantics/resolver.py",
    "src/tickwheel/pipeline/contract/routing.py",
    "src/tickwheel/pipeline/semantics/key_stage.py",
    "src/tickwheel/pipeline/semantics/op_stage.py",
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
    # mypy (and so mypyc) is a build requirement: an ImportError here is a broken
    # build environment, and mypyc's type errors exit the build with their message.
    from mypyc.build import mypycify

    extensions = mypycify(CORE, opt_level="3", debug_level="0", group_name="tickwheel._core")
    # The lock the compiled core takes on every schedule and cancel (see _rawlock.c).
    rawlock = Extension("tickwheel._rawlock", ["src/tickwheel/_rawlock.c"])
    # Hiding a running loop's pending timer handles from the collector (see _gc.c).
    gc = Extension("tickwheel.aio._gc", ["src/tickwheel/aio/_gc.c"])
    return [*extensions, rawlock, gc]


setup(ext_modules=_ext_modules())
