"""Tests of the cache tiers (gateway/cache)."""
