"""Upstream sync: keep files linked to a storage provider (Graph-style) in step with it.

A 410 Gone on an item is terminal (tombstone), a 404 is a bounded retry, 429/503 honour
Retry-After, and a 410 on a delta cursor only means "re-enumerate" (DESIGN.md invariant 14).
"""
