"""Benchmarks run from the repository root: `python3 -m benchmarks.NAME` (docs/benchmarks.md)."""
