"""The notify service's database: its migration folders, upgraded or checked at start-up."""

from __future__ import annotations

from pathlib import Path

from services.common.migrate import prepare_schema, upgrade
from services.common.rate_limits.schema import migration_location as rate_limit_migrations
from services.common.runtime_migrations import migration_location as runtime_migrations

MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLE = "alembic_version_notify"


def migration_locations() -> list[tuple[Path, str]]:
    """Migration folders applied for this service, in order, with their version tables.

    The job runtime's tables (jobs, outbox, dead letters) come first, the rate limit
    counters last.
    """
    return [runtime_migrations(), (MIGRATIONS, VERSION_TABLE), rate_limit_migrations()]


def migrate(url: str) -> None:
    """Bring the database at `url` to the latest schema."""
    upgrade(url, migration_locations())


def prepare(url: str, *, migrate_on_start: bool) -> None:
    """Upgrade (when `migrate_on_start`) or require the schema at head (`SchemaOutdated`)."""
    prepare_schema("notify", url, migration_locations(), migrate_on_start=migrate_on_start)
