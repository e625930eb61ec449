"""Telemetry: the Observer, Prometheus export, batched counts, access log, logs, and the host's
recent history behind ``/dashboard`` (history.py, sampler.py)."""
