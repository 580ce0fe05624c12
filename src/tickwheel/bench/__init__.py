"""Benchmarks: commands, not tests. ``python -m tickwheel.bench --help``."""

#: The benchmarks, as ``python -m tickwheel.bench`` and ``tickwheel bench`` name them.
BENCHMARKS = ("timers", "asyncio", "purgatory", "dispatcher", "pipeline", "pending", "follow",
              "schedules", "service", "reads", "locks")
