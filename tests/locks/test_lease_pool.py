"""Leases granted ahead: used only while acquires keep coming, never stale, never leaked."""

from __future__ import annotations

import asyncio

import pytest

from services.locks.etcd_client import Etcd
from services.locks.lease_pool import LeasePool

pytestmark = pytest.mark.etcd


async def _wait_spare(pool: LeasePool, ttl: int) -> int:
    """The spare's id once the background grant has landed (bounded poll)."""
    for _ in range(500):
        spares = [s for s in pool._shelves.get(ttl, ()) if not s.used]
        if spares:
            return spares[-1].id
        await asyncio.sleep(0.002)
    raise AssertionError("no spare was granted")


async def test_back_to_back_takes_use_a_spare_and_an_idle_pool_grants_none(etcd) -> None:  # type: ignore[no-untyped-def]
    client = Etcd(etcd.endpoint, call_timeout=5)
    pool = LeasePool(client, max_age=0.3)
    try:
        first = await pool.take(10)
        assert not pool._shelves.get(10) and not pool._tasks  # one acquire: nothing granted ahead
        await pool.take(10)  # a second within max_age: the pool starts granting ahead
        spare_id = await _wait_spare(pool, 10)
        third = await pool.take(10)
        assert third.id == spare_id and pool.spares_used == 1
        assert len({first.id, third.id}) == 2
        assert 8 <= await client.lease_remaining(third.id) <= 10

        # Not taken within max_age: revoked, not left for its whole TTL.
        unused = await _wait_spare(pool, 10)
        for _ in range(500):
            if await client.lease_remaining(unused) < 0:
                break
            await asyncio.sleep(0.01)
        assert await client.lease_remaining(unused) < 0
        after_pause = await pool.take(10)  # long after: a fresh grant, not the stale spare
        assert after_pause.id != unused
    finally:
        await pool.close()
        await client.close()


async def test_close_revokes_the_spares(etcd) -> None:  # type: ignore[no-untyped-def]
    client = Etcd(etcd.endpoint, call_timeout=5)
    pool = LeasePool(client, max_age=30)
    try:
        await pool.take(60)
        await pool.take(60)
        spare = await _wait_spare(pool, 60)
        assert await client.lease_remaining(spare) > 0
        await pool.close()
        assert await client.lease_remaining(spare) < 0
    finally:
        await client.close()
