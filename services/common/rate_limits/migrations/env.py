"""Alembic environment of the rate limit counters (no ORM model: raw SQL reads them)."""

from services.common.migrations_env import run

run(None)
