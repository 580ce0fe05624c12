"""``python -m tickwheel.bench timers [--sizes ...]``: prints medians and ratios."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tickwheel.bench._timers import IMPLEMENTATIONS, Result, run_timers

ANCHOR = "asyncio"


def _table(results: list[Result], gc_on: bool) -> str:
    rows = [r for r in results if r.gc == gc_on or r.workload.startswith("W4")]
    lines = []
    keys = sorted({(r.workload, r.n) for r in rows}, key=lambda k: (k[1], k[0]))
    impls = [i for i in IMPLEMENTATIONS if any(r.impl == i for r in rows)]
    lines.append("| workload | N | " + " | ".join(impls) + " |")
    lines.append("|---|---:|" + "---:|" * len(impls))
    for workload, n in keys:
        cell = {r.impl: r for r in rows if (r.workload, r.n) == (workload, n)}
        anchor = cell.get(ANCHOR)
        out = []
        for impl in impls:
            r = cell.get(impl)
            if r is None:
                out.append("n/a")
                continue
            text = f"{r.value:,.0f} B" if r.unit == "bytes" else f"{r.value / 1e3:,.0f}k/s"
            if anchor is not None and impl != ANCHOR and anchor.value:
                text += f" ({r.value / anchor.value:.2f}x)"
            out.append(text)
        lines.append(f"| {workload} | {n:,} | " + " | ".join(out) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tickwheel.bench")
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("timers", help="timer workloads W1-W4 against asyncio, sched, heapq")
    t.add_argument("--sizes", default="10000,100000,1000000",
                   help="comma-separated N (default: %(default)s)")
    t.add_argument("--impls", default=",".join(IMPLEMENTATIONS))
    t.add_argument("--workloads", default="W1,W2,W3,W4")
    t.add_argument("--repeat", type=int, default=5, help="repetitions (median reported)")
    t.add_argument("--gc", choices=["on", "off", "both"], default="both")
    t.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)

    import tickwheel

    sizes = [int(s) for s in args.sizes.split(",")]
    impls = args.impls.split(",")
    unknown = [i for i in impls if i not in IMPLEMENTATIONS]
    if unknown:
        parser.error(f"--impls: unknown {unknown}; choose from {list(IMPLEMENTATIONS)}")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    gc_modes = {"on": [True], "off": [False], "both": [True, False]}[args.gc]
    start = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - start:7.1f}s] {msg}", file=sys.stderr, flush=True)

    results = run_timers(sizes, impls, args.workloads.split(","), args.repeat, gc_modes,
                         progress)
    print(f"\ntimers benchmark: tickwheel.compiled={tickwheel.compiled}, "
          f"median of {args.repeat}, ratio to {ANCHOR} in parentheses\n")
    for gc_on in gc_modes:
        print(f"garbage collector {'on' if gc_on else 'off'}:\n")
        print(_table(results, gc_on))
        print()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
