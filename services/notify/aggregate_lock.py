"""The per-aggregate lock of Ingest: the aggregate's `notify_aggregate_versions` row,
created if missing, row-locked until commit by an upsert whose update changes nothing.
A retired aggregate's row reads as `RETIRED` (`retirement.py`): every event is old.

PostgreSQL runs a constant `text()` statement, built once (the SQL the construct compiled
to), instead of composing and cache-keying the construct on every Ingest, on the session's
psycopg connection (`driver_sql`); SQLite keeps the construct.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.driver_sql import DriverStatement
from services.notify.models import AggregateVersion
from services.notify.retirement import RETIRED
from services.notify.sql import upsert

_PG_LOCK = DriverStatement(
    text(
        """
INSERT INTO notify_aggregate_versions (aggregate_id, applied_version)
VALUES (CAST(:aggregate_id AS VARCHAR), CAST(:applied_version AS BIGINT))
ON CONFLICT (aggregate_id)
DO UPDATE SET applied_version = notify_aggregate_versions.applied_version
RETURNING notify_aggregate_versions.applied_version, notify_aggregate_versions.retired_at
"""
    )
)


async def lock_aggregate(session: AsyncSession, aggregate_id: str) -> int:
    """The aggregate's applied version (0 for a new one, `RETIRED` for a retired one),
    its row locked until commit."""
    values = {"aggregate_id": aggregate_id, "applied_version": 0}
    if session.get_bind().dialect.name == "postgresql":
        version, retired_at = await _PG_LOCK.one(session, values)
    else:
        av = AggregateVersion.__table__.c
        version, retired_at = (
            await session.execute(
                upsert(session, AggregateVersion)
                .values(**values)
                .on_conflict_do_update(
                    index_elements=[av.aggregate_id], set_={"applied_version": av.applied_version}
                )
                .returning(av.applied_version, av.retired_at)
            )
        ).one()
    return RETIRED if retired_at is not None else int(version or 0)
