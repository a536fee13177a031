"""Benchmark scripts: run from the repository root, e.g. ``python -m benchmarks.bench``; not part of the package."""
