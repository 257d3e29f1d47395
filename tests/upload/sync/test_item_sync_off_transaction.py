"""The item sync job's upstream GET holds no database transaction: while the provider
sits on the request, other writers commit, even to the item's own row (SQLite: the
database's write lock; PostgreSQL: the row lock). The job then applies its answer to the
row as it finds it, and a row tombstoned meanwhile is left alone."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import update
from upload.sync.sync_world import DRIVE, SyncWorld

from services.upload.sync import items
from services.upload.sync.jobs import enqueue_item_sync
from services.upload.sync.models import SYNCED, TOMBSTONED, synced_items, utcnow

# Fails the test instead of hanging it if a writer is blocked behind the parked job
# (the gate only opens after the writer returns).
WRITER_DEADLINE_S = 15.0


async def _parked(world: SyncWorld, upstream_id: str, **meta: Any) -> tuple[str, Any, Any]:
    """Link the upstream item `upstream_id` (`meta`: its name, size), hold its upstream GET,
    queue its sync and start one worker pass, which parks in that GET. Returns the item's
    id, the hold and the worker pass's task."""
    world.fake.put_item(DRIVE, upstream_id, **meta)
    item_id = await world.link_item(upstream_id)
    held = world.fake.hold(DRIVE, upstream_id)
    async with world.sessions() as s, s.begin():
        await enqueue_item_sync(s, item_id, reason="test")
    return item_id, held, asyncio.create_task(world.worker.run_once())


async def test_writers_commit_while_the_upstream_call_is_parked(world: SyncWorld) -> None:
    item_id, held, job = await _parked(world, "slow-1", name="upstream.txt", size=7)
    try:
        await asyncio.wait_for(held.arrived.wait(), WRITER_DEADLINE_S)
        # Another item linked, and the parked item's own row written, mid-call.
        other = await asyncio.wait_for(world.link_item("other-1"), WRITER_DEADLINE_S)
        async with world.sessions.begin() as s:
            await asyncio.wait_for(
                s.execute(
                    update(synced_items)
                    .where(synced_items.c.id == item_id)
                    .values(name="local-rename.txt")
                ),
                WRITER_DEADLINE_S,
            )
        assert not job.done()
    finally:
        held.release.set()
    assert await job
    row = await world.item(item_id)
    assert (row["status"], row["name"], row["size"]) == (SYNCED, "upstream.txt", 7)
    assert (await world.item(other))["upstream_item_id"] == "other-1"
    assert await world.dead() == []


async def test_a_row_tombstoned_during_the_call_stays_tombstoned(world: SyncWorld) -> None:
    item_id, held, job = await _parked(world, "race-1", name="race.txt", size=3)
    try:
        await asyncio.wait_for(held.arrived.wait(), WRITER_DEADLINE_S)
        async with world.sessions.begin() as s:
            tombstoned = await asyncio.wait_for(
                items.tombstone(s, item_id, "gone", utcnow()), WRITER_DEADLINE_S
            )
        assert tombstoned
    finally:
        held.release.set()
    assert await job
    row = await world.item(item_id)
    assert (row["status"], row["tombstone_reason"]) == (TOMBSTONED, "gone")
    assert row["name"] != "race.txt"
    assert len(world.fake.item_calls(DRIVE, "race-1")) == 1
