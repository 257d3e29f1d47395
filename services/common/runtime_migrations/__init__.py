"""Alembic folder of the job runtime's tables (jobs, outbox, dead letters, ticks).

Each service applies it before its own migrations, with its own version table, so the
runtime's schema evolves independently of the services that embed it.
"""

from __future__ import annotations

from pathlib import Path

MIGRATIONS = Path(__file__).parent
VERSION_TABLE = "alembic_version_runtime"


def migration_location() -> tuple[Path, str]:
    """(migration folder, version table) for `services.common.migrate.upgrade`."""
    return (MIGRATIONS, VERSION_TABLE)
