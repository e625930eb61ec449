"""Tenants' quotas (gateway/quota/spec.py, limiter.py), the live tenants file (store.py) and
per-tenant accounting (accounting.py)."""
