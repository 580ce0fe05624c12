"""Run CPython's own asyncio tests on tickwheel's loop.

    python -m tickwheel.aio.conformance [MODULE ...] [--loop stock] [-v]

The interpreter ships its asyncio tests as ``test.test_asyncio``. This command makes
:class:`tickwheel.aio.EventLoop` the loop every one of them gets from asyncio itself
(the default policy, ``asyncio.new_event_loop``, ``asyncio.run``, ``asyncio.Runner``,
``IsolatedAsyncioTestCase``, ``asyncio.SelectorEventLoop`` and, from 3.13,
``asyncio.EventLoop``), then runs them with
unittest. Many modules reset the policy in their tear-down; the loop is installed as
the *default* policy's loop class, which such a reset brings back.

That substitution rebinds names in this process's ``asyncio`` package, so this is a
harness for its own process only: nothing in tickwheel does it on import. Tests known
not to pass on any loop but the stock one are listed in ``KNOWN`` with the reason and
skipped; ``--loop stock`` runs the same selection on the stock loop, for comparison.
Exit status: 0 when every test run passed, 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import selectors
import signal
import sys
import unittest
from collections.abc import Sequence

__all__ = ["DEFAULT_MODULES", "KNOWN", "main"]

#: The modules whose tests get their loops from asyncio itself, and those that build
#: most of theirs (test_tasks, test_base_events, test_unix_events) but take some from
#: asyncio: every test here passes on the stock loop too.
DEFAULT_MODULES = (
    "test_timeouts",
    "test_waitfor",
    "test_taskgroups",
    "test_runners",
    "test_locks",
    "test_queues",
    "test_context",
    "test_pep492",
    "test_futures2",
    "test_streams",
    "test_server",
    "test_sock_lowlevel",
    "test_buffered_proto",
    "test_threads",
    "test_events",
    "test_tasks",
    "test_base_events",
    "test_futures",
    "test_subprocess",
    "test_unix_events",
    "test_sendfile",
    "test_ssl",
    "test_sslproto",
    "test_protocols",
    "test_transports",
)

#: Tests that do not pass on tickwheel's loop, each with why: skipped, and named in
#: the report with the reason.
KNOWN: dict[str, str] = {}


class _Counted:
    loops = 0


def _install() -> None:
    from tickwheel.aio import EventLoop, EventLoopPolicy

    class CountedEventLoop(EventLoop):
        def __init__(self, selector: selectors.BaseSelector | None = None) -> None:
            super().__init__(selector)
            _Counted.loops += 1

    class CountedPolicy(EventLoopPolicy):
        _loop_factory = CountedEventLoop

        def new_event_loop(self) -> EventLoop:
            return CountedEventLoop()

    # The default policy's class is looked up on the asyncio package whenever the
    # policy is reset to None; SelectorEventLoop is what tests build directly.
    asyncio.DefaultEventLoopPolicy = CountedPolicy
    asyncio.SelectorEventLoop = CountedEventLoop
    if hasattr(asyncio, "EventLoop"):  # 3.13+: the platform's default loop class
        asyncio.EventLoop = CountedEventLoop
    asyncio.set_event_loop_policy(None)


def _skip_known(suite: unittest.TestSuite) -> unittest.TestSuite:
    out = unittest.TestSuite()
    for test in suite:
        if isinstance(test, unittest.TestSuite):
            out.addTest(_skip_known(test))
            continue
        reason = KNOWN.get(test.id().removeprefix("test.test_asyncio."))
        if isinstance(test, unittest.TestCase) and reason is not None:
            name = test._testMethodName
            skipped = unittest.skip(f"known on tickwheel's loop: {reason}")(getattr(test, name))
            setattr(test, name, skipped)
        out.addTest(test)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tickwheel.aio.conformance",
        description="Run CPython's test.test_asyncio modules on tickwheel's event loop.")
    parser.add_argument("modules", nargs="*", metavar="MODULE",
                        help=f"test_asyncio modules (default: {' '.join(DEFAULT_MODULES)})")
    parser.add_argument("--loop", choices=("tickwheel", "stock"), default="tickwheel",
                        help="the loop to run them on (default: tickwheel)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    modules = args.modules or list(DEFAULT_MODULES)
    bad = [m for m in modules if not m.isidentifier() or not m.startswith("test_")]
    if bad:
        parser.error(f"not a test_asyncio module name: {', '.join(bad)}")
    try:
        importlib.import_module("test.test_asyncio")
    except ImportError:
        print("this Python has no test.test_asyncio (install its test suite package, "
              "e.g. Debian's libpython3.11-testsuite)", file=sys.stderr)
        return 2
    # test_runners interrupts the main thread and expects SIGINT to raise. A process
    # started in the background by a non-interactive shell inherits SIGINT ignored;
    # those tests then never end, on the stock loop too, allocating as they wait.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.loop == "tickwheel":
        _install()
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for module in modules:
        try:
            suite.addTest(loader.loadTestsFromName(f"test.test_asyncio.{module}"))
        except (ImportError, AttributeError) as exc:
            parser.error(f"cannot load test.test_asyncio.{module}: {exc}")
    if args.loop == "tickwheel":
        suite = _skip_known(suite)
    runner = unittest.TextTestRunner(verbosity=2 if args.verbose else 1)
    result = runner.run(suite)
    if args.loop == "tickwheel":
        print(f"tickwheel.aio.EventLoop instances created: {_Counted.loops}")
        if _Counted.loops == 0:
            print("no test ran on tickwheel's loop", file=sys.stderr)
            return 1
    return 0 if result.wasSuccessful() and result.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
