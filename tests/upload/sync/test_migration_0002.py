"""sync_0002 on a database holding sync_0001 rows: rows kept, uniqueness now per tenant."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import create_engine, insert, select
from sqlalchemy.exc import IntegrityError

from services.common.db import sync_url
from services.common.migrate import alembic_config, upgrade
from services.common.runtime_migrations import migration_location as runtime_location
from services.upload.sync.database import MIGRATIONS, VERSION_TABLE
from services.upload.sync.models import linked_drives, utcnow


def _drive(id_: str, tenant: str) -> dict[str, object]:
    now = utcnow()
    return {
        "id": id_,
        "tenant_id": tenant,
        "account_id": "acct",
        "upstream_drive_id": "drv",
        "full_resync_count": 0,
        "created_at": now,
        "updated_at": now,
    }


def test_existing_rows_survive_and_uniqueness_becomes_per_tenant(database_url: str) -> None:
    upgrade(database_url, [runtime_location()])
    cfg = alembic_config(database_url, MIGRATIONS, VERSION_TABLE)
    command.upgrade(cfg, "sync_0001")
    engine = create_engine(sync_url(database_url))
    try:
        with engine.begin() as conn:
            conn.execute(insert(linked_drives).values(_drive("d1", "acme")))
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(insert(linked_drives).values(_drive("d2", "evil")))
        command.upgrade(cfg, "head")
        with engine.begin() as conn:
            conn.execute(insert(linked_drives).values(_drive("d2", "evil")))
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(insert(linked_drives).values(_drive("d3", "evil")))
        with engine.connect() as conn:
            assert set(conn.execute(select(linked_drives.c.id)).scalars()) == {"d1", "d2"}
    finally:
        engine.dispose()
