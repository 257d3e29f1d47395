"""The PostgreSQL store on a real server: racing replicas (each its own connections)
never count past the limit; the migration made the table unlogged; old windows go."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest
from sqlalchemy.engine import make_url

from services.common.jobs.listener import libpq_url
from services.common.migrate import upgrade
from services.common.rate_limits import Limiter, PostgresCounterStore, database_store
from services.common.rate_limits.memory_store import MemoryCounterStore
from services.common.rate_limits.schema import migration_location

pytestmark = pytest.mark.postgres
# Long enough that a test never straddles two windows (see `one_window`).
WINDOW = 86_400.0


@pytest.fixture
def pg_url(postgres) -> str:
    url = postgres.create()
    upgrade(url, [migration_location()])
    return url


def one_window() -> int:
    return int(time.time() // WINDOW)


async def test_racing_replicas_admit_exactly_the_limit(pg_url: str) -> None:
    for limit, calls in ((40, 200), (1_000, 1_600)):
        stores = [PostgresCounterStore(make_url(pg_url)) for _ in range(2)]
        replicas = [Limiter(s, service="test", window_seconds=WINDOW, batch_max=32) for s in stores]
        try:
            window = one_window()
            results = await asyncio.gather(
                *(replicas[i % 2].take(f"k{limit}", limit) for i in range(calls))
            )
            assert one_window() == window, "the test straddled a window: run it again"
            admitted = sum(r is None for r in results)
            # Batch 1 (limit 40): exact. Batch 20 (limit 1,000): a replica's reservation
            # can lapse unspent, at most batch - 1 units of each.
            slack = 2 * (replicas[0].batch(limit) - 1)
            assert limit - slack <= admitted <= limit, (limit, admitted)
            with psycopg.connect(libpq_url(make_url(pg_url))) as conn:
                row = conn.execute(
                    "SELECT count FROM rate_limit_counters WHERE key = %s", (f"k{limit}",)
                ).fetchone()
            assert row == (limit,)
        finally:
            for s in stores:
                await s.close()


async def test_the_counters_are_unlogged_and_old_windows_are_purged(pg_url: str) -> None:
    with psycopg.connect(libpq_url(make_url(pg_url)), autocommit=True) as conn:
        persistence = conn.execute(
            "SELECT relpersistence FROM pg_class WHERE relname = 'rate_limit_counters'"
        ).fetchone()
        assert persistence == ("u",)
        conn.execute(
            "INSERT INTO rate_limit_counters VALUES ('old', 1, 5, 5, %s)", (int(time.time()) - 1,)
        )
    store = PostgresCounterStore(make_url(pg_url))
    try:
        assert await store.take("new", one_window(), 3, 10, int(time.time()) + 60) == 3
        assert await store.take("new", one_window(), 9, 10, int(time.time()) + 60) == 7
        assert await store.take("new", one_window(), 1, 10, int(time.time()) + 60) == 0
    finally:
        await store.close()
    with psycopg.connect(libpq_url(make_url(pg_url))) as conn:
        keys = conn.execute("SELECT key FROM rate_limit_counters ORDER BY key").fetchall()
    assert keys == [("new",)]


def test_a_sqlite_service_counts_in_memory(tmp_path) -> None:
    assert isinstance(database_store(f"sqlite+aiosqlite:///{tmp_path}/x.db"), MemoryCounterStore)


async def test_a_burst_over_many_keys_is_a_few_statements_and_racing_replicas_stay_exact(
    pg_url: str,
) -> None:
    """A share told to thousands of users' streams spends one unit of each user's key at
    once: the requests queued meanwhile go as one statement (not a round trip a key), and
    two replicas racing over the same keys (rows locked in one order) never deadlock or
    count past a limit."""
    statements = 0

    class Counting(PostgresCounterStore):
        async def _take(self, slot, batch):  # type: ignore[no-untyped-def]
            nonlocal statements
            statements += 1
            return await super()._take(slot, batch)

    keys, limit = 2_000, 3
    stores = [Counting(make_url(pg_url)) for _ in range(2)]
    replicas = [Limiter(s, service="test", window_seconds=WINDOW, batch_max=1) for s in stores]
    try:
        window = one_window()
        # Each key asked limit + 1 times by each replica: exactly `limit` admitted a key.
        results = await asyncio.gather(
            *(
                replicas[r].take(f"user-{k}", limit)
                for _ in range(limit + 1)
                for r in (0, 1)
                for k in range(keys)
            )
        )
        assert one_window() == window, "the test straddled a window: run it again"
    finally:
        for s in stores:
            await s.close()
    assert sum(r is None for r in results) == keys * limit
    # One unit a request (batch_max 1): at least 3 requests a key, 6,000 in all.
    assert statements < keys * limit / 50, statements
    with psycopg.connect(libpq_url(make_url(pg_url))) as conn:
        counts = conn.execute(
            "SELECT count(*), min(count), max(count) FROM rate_limit_counters"
            " WHERE key LIKE 'user-%'"
        ).fetchone()
    assert counts == (keys, limit, limit)
