"""The item sync job's upstream GET holds no database transaction: while the provider
sits on the request, other writers commit, even to the item's own row (SQLite: the
database's write lock; PostgreSQL: the row lock). The job then applies its answer to the
row as it finds it, and a row tombstoned meanwhile is left alone."""

from __future__ import annotations

import asyncio

from sqlalchemy import update
from sync.sync_world import DRIVE, SyncWorld

from services.upload.sync import items
from services.upload.sync.jobs import enqueue_item_sync
from services.upload.sync.models import SYNCED, TOMBSTONED, synced_items, utcnow

# Fails the test instead of hanging it if a writer is blocked behind the parked job
# (the gate only opens after the writer returns).
WRITER_DEADLINE_S = 15.0


async def _trigger(world: SyncWorld, item_id: str) -> None:
    async with world.sessions() as s, s.begin():
        await enqueue_item_sync(s, item_id, reason="test")


async def test_writers_commit_while_the_upstream_call_is_parked(world: SyncWorld) -> None:
    world.fake.put_item(DRIVE, "slow-1", name="upstream.txt", size=7)
    item_id = await world.link_item("slow-1")
    held = world.fake.hold(DRIVE, "slow-1")
    await _trigger(world, item_id)
    job = asyncio.create_task(world.worker.run_once())
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
    world.fake.put_item(DRIVE, "race-1", name="race.txt", size=3)
    item_id = await world.link_item("race-1")
    held = world.fake.hold(DRIVE, "race-1")
    await _trigger(world, item_id)
    job = asyncio.create_task(world.worker.run_once())
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
