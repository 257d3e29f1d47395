"""Every service's migrations apply from nothing to head on SQLite and on PostgreSQL,
and applying them again is a no-op."""

from __future__ import annotations

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text

from services.common.db import sync_url
from services.common.migrate import alembic_config, upgrade
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


def test_tenant_usage_starts_from_the_files_already_stored(database_url: str) -> None:
    """upload_0008 fills `tenant_usage` from the files there before it (then its triggers
    keep it: tests/upload/storage/test_tenant_usage.py)."""
    runtime, (location, table), *_ = upload_db.migration_locations()
    upgrade(database_url, [runtime])  # the job runtime's tables, which upload's follow
    command.upgrade(alembic_config(database_url, location, table), "upload_0007")
    engine = create_engine(sync_url(database_url))
    try:
        with engine.begin() as conn:
            for n, (tenant, kind, size) in enumerate(
                [
                    ("acme", "folder", 0),
                    ("acme", "file", 10),
                    ("acme", "file", 5),
                    ("evil", "file", 7),
                ]
            ):
                conn.execute(
                    text(
                        "INSERT INTO files (id, tenant_id, parent_id, name, kind, owner_user_id,"
                        " version, children_version, size, checksum, checksum_algorithm,"
                        " blob_key, last_lock_token, created_at, updated_at)"
                        " VALUES (:id, :tenant, NULL, :name, :kind, 'u', 1, 0, :size, '', '',"
                        " '', 0, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                    ),
                    {"id": f"f{n}", "tenant": tenant, "name": f"n{n}", "kind": kind, "size": size},
                )
        upload_db.migrate(database_url)
        with engine.connect() as conn:
            usage = dict(
                conn.execute(text("SELECT tenant_id, stored_bytes FROM tenant_usage")).all()
            )
        assert usage == {"acme": 15, "evil": 7}
    finally:
        engine.dispose()
