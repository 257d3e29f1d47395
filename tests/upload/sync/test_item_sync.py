"""Invariant 14 on items, against the fake provider over loopback, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

from upload.sync.sync_world import DRIVE, SyncWorld

from services.upload.sync.jobs import enqueue_item_sync
from services.upload.sync.models import PENDING_RETRY, SYNCED, TOMBSTONED, utcnow


async def _trigger(world: SyncWorld, item_id: str) -> None:
    async with world.sessions() as s, s.begin():
        await enqueue_item_sync(s, item_id, reason="test")


async def test_410_tombstones_after_one_call_and_never_calls_again(world: SyncWorld) -> None:
    item_id = await world.link_item("gone-1", cache_key="cache/gone-1")
    world.cache.store("cache/gone-1", b"abc")
    world.fake.always(DRIVE, "gone-1", 410)
    await _trigger(world, item_id)
    await world.drain()

    row = await world.item(item_id)
    assert row["status"] == TOMBSTONED
    assert row["tombstone_reason"] == "gone"
    assert row["tombstoned_at"] is not None
    assert not world.cache.path("cache/gone-1").exists()
    assert len(world.fake.item_calls(DRIVE, "gone-1")) == 1
    assert await world.dead() == []

    # Later triggers (reconcile, operator, webhook) never reach the provider again.
    for _ in range(3):
        await _trigger(world, item_id)
        await world.drain()
    assert len(world.fake.item_calls(DRIVE, "gone-1")) == 1
    assert (await world.item(item_id))["status"] == TOMBSTONED


async def test_404_then_200_is_synced_after_retries(world: SyncWorld) -> None:
    world.fake.put_item(DRIVE, "late-1", name="late.txt", size=42)
    world.fake.script(DRIVE, "late-1", 404, 404, 404)
    item_id = await world.link_item("late-1")
    await _trigger(world, item_id)

    async def pending_seen() -> bool:
        row = await world.item(item_id)
        return row["status"] == PENDING_RETRY and row["retry_count"] >= 1

    await world.run_until(pending_seen)
    await world.drain()
    row = await world.item(item_id)
    assert row["status"] == SYNCED
    assert row["retry_count"] == 0
    assert (row["name"], row["size"]) == ("late.txt", 42)
    assert len(world.fake.item_calls(DRIVE, "late-1")) == 4
    assert await world.dead() == []


async def test_404_forever_is_dead_lettered_after_the_bound(world: SyncWorld) -> None:
    bound = world.engine.settings.max_not_found_retries
    world.fake.always(DRIVE, "never-1", 404)
    item_id = await world.link_item("never-1")
    await _trigger(world, item_id)

    async def buried() -> bool:
        return bool(await world.dead())

    await world.run_until(buried)
    await world.drain()
    calls = world.fake.item_calls(DRIVE, "never-1")
    assert len(calls) == bound + 1
    # Backoff: the gaps between attempts are not all zero (jittered, growing ceiling).
    assert calls[-1].at > calls[0].at
    (dead,) = await world.dead()
    assert dead["error_class"] == "permanent"
    assert "404" in dead["error_message"] and "never-1" in dead["error_message"]
    assert dead["payload"]["upstream_item_id"] == "never-1"
    assert dead["payload"]["upstream_drive_id"] == DRIVE
    row = await world.item(item_id)
    assert row["status"] == PENDING_RETRY  # not a tombstone: 404 is never proof of deletion
    assert row["retry_count"] == bound


async def test_429_retry_after_is_honoured(world: SyncWorld) -> None:
    world.fake.put_item(DRIVE, "busy-1")
    world.fake.script(DRIVE, "busy-1", 429, Retry_After="2")
    item_id = await world.link_item("busy-1")
    await _trigger(world, item_id)

    async def synced() -> bool:
        return (await world.item(item_id))["status"] == SYNCED

    await world.run_until(synced, deadline_s=30)
    first, second = world.fake.item_calls(DRIVE, "busy-1")
    assert second.at - first.at >= 2.0


async def test_503_then_200_retries_as_transient(world: SyncWorld) -> None:
    world.fake.put_item(DRIVE, "flaky-1")
    world.fake.script(DRIVE, "flaky-1", 503, 500)
    item_id = await world.link_item("flaky-1")
    await _trigger(world, item_id)
    await world.drain()
    assert (await world.item(item_id))["status"] == SYNCED
    assert len(world.fake.item_calls(DRIVE, "flaky-1")) == 3


async def test_401_is_permanent_and_dead_lettered_at_once(world: SyncWorld) -> None:
    world.fake.always(DRIVE, "locked-1", 401)
    item_id = await world.link_item("locked-1")
    await _trigger(world, item_id)
    await world.drain()
    assert len(world.fake.item_calls(DRIVE, "locked-1")) == 1
    (dead,) = await world.dead()
    assert dead["error_class"] == "permanent"
    assert "credentials" in dead["error_message"]
    assert (await world.item(item_id))["status"] != TOMBSTONED


async def test_expired_item_is_tombstoned_without_a_network_call(world: SyncWorld) -> None:
    item_id = await world.link_item("old-1")
    async with world.sessions() as s, s.begin():
        from sqlalchemy import update

        from services.upload.sync.models import synced_items

        await s.execute(
            update(synced_items)
            .where(synced_items.c.id == item_id)
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
    await _trigger(world, item_id)
    await world.drain()
    row = await world.item(item_id)
    assert (row["status"], row["tombstone_reason"]) == (TOMBSTONED, "expired")
    assert world.fake.item_calls(DRIVE, "old-1") == []


async def test_upstream_expiry_in_the_past_tombstones(world: SyncWorld) -> None:
    past = (utcnow() - timedelta(days=1)).isoformat()
    world.fake.put_item(DRIVE, "ret-1", expirationDateTime=past)
    item_id = await world.link_item("ret-1")
    await _trigger(world, item_id)
    await world.drain()
    assert (await world.item(item_id))["status"] == TOMBSTONED
