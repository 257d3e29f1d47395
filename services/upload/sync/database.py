"""The sync engine's migration folder, applied after the upload service's own."""

from __future__ import annotations

from pathlib import Path

MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLE = "alembic_version_upload_sync"


def migration_location() -> tuple[Path, str]:
    """(migration folder, version table) for `services.common.migrate.upgrade`."""
    return (MIGRATIONS, VERSION_TABLE)
