"""Telemetry: the Observer, Prometheus export, batched counts, stats, access log, logs."""
