"""Relay leases: at most one relay publishes a given aggregate at a time.

A lease is a row per aggregate. Taking it is one upsert that succeeds only when the row
is absent or its lease has ended; renewing and releasing are conditional on the token.
The same statements work on SQLite and PostgreSQL (both support
INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import ColumnElement, Table, delete, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.jobs.models import utcnow
from services.common.outbox.models import relay_leases


def _insert_for(session: AsyncSession) -> Callable[[Table], Any]:
    """The dialect's INSERT (both have ON CONFLICT DO UPDATE)."""
    dialect = session.get_bind().dialect.name
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


def aggregate_key(aggregate_type: str, aggregate_id: str) -> str:
    """The lease row's key for one aggregate."""
    return f"{aggregate_type}:{aggregate_id}"


async def acquire(session: AsyncSession, key: str, holder: str, seconds: float) -> str | None:
    """Take the lease on `key` for `seconds`; its token, or None if someone else holds it."""
    taken = await acquire_many(session, [key], holder, seconds)
    return taken.get(key)


async def acquire_many(
    session: AsyncSession, keys: list[str], holder: str, seconds: float
) -> dict[str, str]:
    """`acquire` for several keys in one statement: {key: token} for those taken.

    The rows are written in key order, so two relays taking overlapping sets on
    PostgreSQL lock them in one order and never deadlock."""
    if not keys:
        return {}
    now = utcnow()
    expires = now + timedelta(seconds=seconds)
    rows = [
        {
            "aggregate_key": key,
            "holder": holder,
            "lease_token": uuid.uuid4().hex,
            "expires_at": expires,
        }
        for key in sorted(set(keys))
    ]
    stmt = _insert_for(session)(relay_leases).values(rows)
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
    ).returning(relay_leases.c.aggregate_key, relay_leases.c.lease_token)
    return {key: token for key, token in await session.execute(upsert)}


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


async def renew_many(session: AsyncSession, held: dict[str, str], seconds: float) -> set[str]:
    """`renew` for several leases in one statement: the keys still ours."""
    if not held:
        return set()
    result = await session.execute(
        update(relay_leases)
        .where(_held(held))
        .values(expires_at=utcnow() + timedelta(seconds=seconds))
        .returning(relay_leases.c.aggregate_key)
    )
    return {key for (key,) in result}


async def release_many(session: AsyncSession, held: dict[str, str]) -> None:
    """`release` for several leases in one statement."""
    if held:
        await session.execute(delete(relay_leases).where(_held(held)))


def _held(held: dict[str, str]) -> ColumnElement[bool]:
    pairs = tuple_(relay_leases.c.aggregate_key, relay_leases.c.lease_token)
    return pairs.in_(sorted(held.items()))
