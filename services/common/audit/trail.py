"""Writing and reading the audit trail.

`record` adds one row in the caller's transaction: the change and its audit row commit or
roll back together, so the trail never shows a change that did not happen, nor misses one
that did. A read that changes nothing (a download) records in a transaction of its own.
`query` pages the trail newest first, by tenant, principal, target and time range.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from services.common import write_behind
from services.common.audit.models import audit_events
from services.common.auth import Identity
from services.common.correlation import current_correlation_id
from services.common.jobs.models import utcnow
from services.common.session_sql import SessionStatement

# Who acts when no caller does: a periodic purge.
SYSTEM = "system"


def principal_of(identity: Identity) -> str:
    """The audit name of a caller: its user id, or `service:{name}` for a service."""
    if identity.is_service:
        return f"service:{identity.service}"
    return identity.user_id


# Built once (its values passed at execution).
_ROWS = write_behind.Rows(SessionStatement(insert(audit_events)))


async def record(
    session: AsyncSession,
    *,
    tenant_id: str,
    principal: str,
    action: str,
    target_type: str,
    target_id: str,
    detail: Mapping[str, Any] | None = None,
) -> None:
    """Add one audit row in `session`'s transaction (the bound correlation id, now;
    written behind in a group commit: `write_behind`)."""
    await write_behind.write(
        session,
        _ROWS,
        {
            "at": utcnow(),
            "tenant_id": tenant_id,
            "principal": principal or SYSTEM,
            "action": action,
            "target_type": target_type,
            "target_id": target_id,
            "correlation_id": current_correlation_id(),
            "detail": dict(detail or {}),
        },
    )


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """Filters of one page of the trail; empty strings and None match everything."""

    tenant_id: str = ""
    principal: str = ""
    target_id: str = ""
    since: datetime | None = None  # inclusive
    until: datetime | None = None  # exclusive
    before_id: int = 0  # the page token: rows older than this id (0: from the newest)
    limit: int = 50


async def query(session: AsyncSession, q: AuditQuery) -> list[dict[str, Any]]:
    """Up to `q.limit` rows matching `q`, newest first (by id: the insertion order)."""
    stmt = select(audit_events).order_by(audit_events.c.id.desc()).limit(q.limit)
    if q.tenant_id:
        stmt = stmt.where(audit_events.c.tenant_id == q.tenant_id)
    if q.principal:
        stmt = stmt.where(audit_events.c.principal == q.principal)
    if q.target_id:
        stmt = stmt.where(audit_events.c.target_id == q.target_id)
    if q.since is not None:
        stmt = stmt.where(audit_events.c.at >= q.since)
    if q.until is not None:
        stmt = stmt.where(audit_events.c.at < q.until)
    if q.before_id:
        stmt = stmt.where(audit_events.c.id < q.before_id)
    return [dict(row) for row in (await session.execute(stmt)).mappings()]


def purge_statement(older_than: datetime, batch: int) -> Any:
    """Delete up to `batch` rows recorded before `older_than` (the retention job's step)."""
    oldest = (
        select(audit_events.c.id)
        .where(audit_events.c.at < older_than)
        .order_by(audit_events.c.id)
        .limit(batch)
    )
    return delete(audit_events).where(audit_events.c.id.in_(oldest))
