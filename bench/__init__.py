"""Benchmarks (``make bench`` / ``python -m bench NAME``): ratios measured side by side."""
