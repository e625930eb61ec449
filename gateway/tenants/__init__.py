"""Tenants: API keys to tenant ids (directory.py), the live tenants file (store.py), quotas
(quota/)."""
