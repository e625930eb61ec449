"""Telemetry kept by the gateway itself: the host's recent history behind ``/dashboard``."""
