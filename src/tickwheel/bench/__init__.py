"""Benchmarks: commands, not tests. ``python -m tickwheel.bench --help``."""
