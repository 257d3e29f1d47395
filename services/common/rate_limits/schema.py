"""The counters' migration folder, applied by each service that counts in its database."""

from __future__ import annotations

from pathlib import Path

MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLE = "alembic_version_rate_limits"


def migration_location() -> tuple[Path, str]:
    """(migration folder, version table) for `services.common.migrate.upgrade`."""
    return (MIGRATIONS, VERSION_TABLE)
