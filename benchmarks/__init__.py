"""Benchmarks and reproductions: `python -m benchmarks.NAME` from the repository root (not installed)."""
