"""Tenants' quotas (gateway/tenants/quota/spec.py, limiter.py), the live tenants file (store.py) and
per-tenant accounting (accounting.py)."""
