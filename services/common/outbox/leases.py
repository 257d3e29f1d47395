"""Relay leases: at most one relay publishes a given aggregate at a time.

A lease is a row per aggregate. Taking it is one upsert that succeeds only when the row
is absent or its lease has ended; renewing and releasing are conditional on the token.
The same statements work on SQLite and PostgreSQL (both support
INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING).
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import delete, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.jobs.models import utcnow
from services.common.outbox.models import relay_leases


def aggregate_key(aggregate_type: str, aggregate_id: str) -> str:
    """The lease row's key for one aggregate."""
    return f"{aggregate_type}:{aggregate_id}"


async def acquire(session: AsyncSession, key: str, holder: str, seconds: float) -> str | None:
    """Take the lease on `key` for `seconds`; its token, or None if someone else holds it."""
    now = utcnow()
    dialect = session.get_bind().dialect.name
    dialect_insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    token = uuid.uuid4().hex
    stmt = dialect_insert(relay_leases).values(
        aggregate_key=key,
        holder=holder,
        lease_token=token,
        expires_at=now + timedelta(seconds=seconds),
    )
    # Under a conflict PostgreSQL locks the existing row and re-checks WHERE on its latest
    # version, so two relays racing for an expired lease cannot both take it.
    upsert = stmt.on_conflict_do_update(
        index_elements=[relay_leases.c.aggregate_key],
        set_={
            "holder": stmt.excluded.holder,
            "lease_token": stmt.excluded.lease_token,
            "expires_at": stmt.excluded.expires_at,
        },
        where=relay_leases.c.expires_at < now,
    ).returning(relay_leases.c.lease_token)
    row = (await session.execute(upsert)).first()
    return row[0] if row is not None else None


async def renew(session: AsyncSession, key: str, token: str, seconds: float) -> bool:
    """Extend our lease; False when it is no longer ours."""
    result = await session.execute(
        update(relay_leases)
        .where(relay_leases.c.aggregate_key == key, relay_leases.c.lease_token == token)
        .values(expires_at=utcnow() + timedelta(seconds=seconds))
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def release(session: AsyncSession, key: str, token: str) -> None:
    """Give the lease up (only if still ours)."""
    await session.execute(
        delete(relay_leases).where(
            relay_leases.c.aggregate_key == key, relay_leases.c.lease_token == token
        )
    )
