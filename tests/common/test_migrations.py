"""Every service's migrations apply from nothing to head on SQLite and on PostgreSQL,
and applying them again is a no-op."""

from __future__ import annotations

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text

from services.common.db import sync_url
from services.common.migrate import alembic_config
from services.notify import database as notify_db
from services.upload import database as upload_db


@pytest.mark.parametrize("service_db", [upload_db, notify_db], ids=["upload", "notify"])
def test_migrations_reach_head_on_both_databases(service_db, database_url: str) -> None:
    service_db.migrate(database_url)
    service_db.migrate(database_url)  # idempotent: already at head
    engine = create_engine(sync_url(database_url))
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            for location, version_table in service_db.migration_locations():
                assert version_table in tables
                head = ScriptDirectory.from_config(
                    alembic_config(database_url, location, version_table)
                ).get_current_head()
                current = conn.execute(text(f"SELECT version_num FROM {version_table}")).scalar()
                assert current == head
    finally:
        engine.dispose()
