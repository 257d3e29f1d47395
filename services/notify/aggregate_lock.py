"""The per-aggregate lock of Ingest: the aggregate's `notify_aggregate_versions` row,
created if missing, row-locked until commit by an upsert whose update changes nothing.
A retired aggregate's row reads as `RETIRED` (`retirement.py`): every event is old.

Built once per dialect and run on the session's driver connection (`session_sql`), not
composed and cache-keyed on every Ingest: PostgreSQL's as a constant `text()` (the SQL the
construct compiled to), SQLite's as the construct.
"""

from __future__ import annotations

from sqlalchemy import String, bindparam, text
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.session_sql import SessionStatement
from services.notify.models import AggregateVersion
from services.notify.retirement import RETIRED

_AV = AggregateVersion.__table__.c
_SQLITE_LOCK = (
    sqlite.insert(AggregateVersion)
    .values(aggregate_id=bindparam("aggregate_id", type_=String), applied_version=0)
    .on_conflict_do_update(
        index_elements=[_AV.aggregate_id], set_={"applied_version": _AV.applied_version}
    )
    .returning(_AV.applied_version, _AV.retired_at)
)
_LOCK = SessionStatement(
    {
        "postgresql": text(
            """
INSERT INTO notify_aggregate_versions (aggregate_id, applied_version)
VALUES (CAST(:aggregate_id AS VARCHAR), 0)
ON CONFLICT (aggregate_id)
DO UPDATE SET applied_version = notify_aggregate_versions.applied_version
RETURNING notify_aggregate_versions.applied_version, notify_aggregate_versions.retired_at
"""
        ),
        "sqlite": _SQLITE_LOCK,
    }
)


async def lock_aggregate(session: AsyncSession, aggregate_id: str) -> int:
    """The aggregate's applied version (0 for a new one, `RETIRED` for a retired one),
    its row locked until commit."""
    version, retired_at = await _LOCK.one(session, {"aggregate_id": aggregate_id})
    return RETIRED if retired_at is not None else int(version or 0)
