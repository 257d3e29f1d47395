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

from sqlalchemy import ColumnElement, String, Table, bindparam, delete, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.jobs.models import utcnow
from services.common.outbox.models import relay_leases
from services.common.session_sql import SessionStatements


def _acquire(insert: Callable[[Table], Any], count: int) -> Any:
    """The upsert taking `count` leases (rows `key_i`, `holder`, `token_i`, `expires_at`)."""
    stmt = insert(relay_leases).values(
        [
            {
                "aggregate_key": bindparam(f"key_{i}", type_=String),
                "holder": bindparam("holder", type_=String),
                "lease_token": bindparam(f"token_{i}", type_=String),
                "expires_at": bindparam("expires_at", type_=relay_leases.c.expires_at.type),
            }
            for i in range(count)
        ]
    )
    # Under a conflict PostgreSQL locks the existing row and re-checks WHERE on its latest
    # version, so two relays racing for an expired lease cannot both take it.
    return stmt.on_conflict_do_update(
        index_elements=[relay_leases.c.aggregate_key],
        set_={
            "holder": stmt.excluded.holder,
            "lease_token": stmt.excluded.lease_token,
            "expires_at": stmt.excluded.expires_at,
        },
        where=relay_leases.c.expires_at < bindparam("now", type_=relay_leases.c.expires_at.type),
    ).returning(relay_leases.c.aggregate_key, relay_leases.c.lease_token)


def _pairs(count: int) -> ColumnElement[bool]:
    """(aggregate_key, lease_token) is one of `count` pairs `key_i`, `token_i`."""
    return tuple_(relay_leases.c.aggregate_key, relay_leases.c.lease_token).in_(
        [
            tuple_(bindparam(f"key_{i}", type_=String), bindparam(f"token_{i}", type_=String))
            for i in range(count)
        ]
    )


def _in_key_order(count: int) -> ColumnElement[bool]:
    """The rows of `count` pairs, locked in key order first (PostgreSQL: the subquery's
    FOR UPDATE after its ORDER BY; SQLite has no row locks and renders none): the order
    `acquire_many` takes them in, so a relay renewing or releasing its leases and another
    taking some of the same never wait on each other in a cycle. An UPDATE or DELETE
    alone locks in whatever order its plan reads the rows."""
    keys = relay_leases.c.aggregate_key
    ordered = select(keys).where(_pairs(count)).order_by(keys).with_for_update()
    return keys.in_(ordered.scalar_subquery())


# Built once per count of leases (values passed at execution).
_ACQUIRE = SessionStatements(
    lambda n: {"postgresql": _acquire(postgresql.insert, n), "sqlite": _acquire(sqlite.insert, n)}
)
_RENEW = SessionStatements(
    lambda n: (
        update(relay_leases)
        .where(_in_key_order(n))
        .values(expires_at=bindparam("until", type_=relay_leases.c.expires_at.type))
        .returning(relay_leases.c.aggregate_key)
    )
)
_RELEASE = SessionStatements(
    lambda n: delete(relay_leases).where(_in_key_order(n)).returning(relay_leases.c.aggregate_key)
)


def _held_values(held: dict[str, str]) -> dict[str, Any]:
    """The `key_i`, `token_i` values of `held`, in key order."""
    values: dict[str, Any] = {}
    for i, (key, token) in enumerate(sorted(held.items())):
        values[f"key_{i}"], values[f"token_{i}"] = key, token
    return values


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
    ordered = sorted(set(keys))
    values: dict[str, Any] = {
        "holder": holder,
        "expires_at": now + timedelta(seconds=seconds),
        "now": now,
    }
    taken: dict[str, str] = {}
    # In chunks of a power of two (37: 32, 4, 1), in key order: a few statements to
    # compile, however the counts vary (an upsert cannot repeat a row to pad its list).
    start = 0
    while start < len(ordered):
        size = 1 << ((len(ordered) - start).bit_length() - 1)
        chunk = dict(values)
        for i, key in enumerate(ordered[start : start + size]):
            chunk[f"key_{i}"], chunk[f"token_{i}"] = key, uuid.uuid4().hex
        taken.update(await _ACQUIRE.of(size).rows(session, chunk))
        start += size
    return taken


async def renew(session: AsyncSession, key: str, token: str, seconds: float) -> bool:
    """Extend our lease; False when it is no longer ours."""
    return key in await renew_many(session, {key: token}, seconds)


async def release(session: AsyncSession, key: str, token: str) -> None:
    """Give the lease up (only if still ours)."""
    await release_many(session, {key: token})


async def renew_many(session: AsyncSession, held: dict[str, str], seconds: float) -> set[str]:
    """`renew` for several leases in one statement: the keys still ours."""
    if not held:
        return set()
    values = {**_held_values(held), "until": utcnow() + timedelta(seconds=seconds)}
    renew = _RENEW.of_padded(values, ("key", "token"), len(held))
    return {key for (key,) in await renew.rows(session, values)}


async def release_many(session: AsyncSession, held: dict[str, str]) -> set[str]:
    """`release` for several leases in one statement: the keys given up, those whose lease
    was still ours (its token unchanged)."""
    if not held:
        return set()
    values = _held_values(held)
    release = _RELEASE.of_padded(values, ("key", "token"), len(held))
    return {key for (key,) in await release.rows(session, values)}
