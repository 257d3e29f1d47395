"""Delta polls against the fake provider: @removed, next links, an expired cursor."""

from __future__ import annotations

from sqlalchemy import insert, select
from sync.sync_world import ACCOUNT, DRIVE, TENANT, SyncWorld

from services.upload.sync.jobs import enqueue_delta_poll
from services.upload.sync.models import SYNCED, TOMBSTONED, linked_drives, synced_items, utcnow

LINK = "link-1"


async def _link_drive(world: SyncWorld, delta_token: str | None) -> None:
    now = utcnow()
    async with world.sessions() as s, s.begin():
        await s.execute(
            insert(linked_drives).values(
                id=LINK,
                tenant_id=TENANT,
                account_id=ACCOUNT,
                upstream_drive_id=DRIVE,
                delta_link=None
                if delta_token is None
                else world.fake.delta_url(DRIVE, delta_token),
                full_resync_count=0,
                created_at=now,
                updated_at=now,
            )
        )


async def _poll(world: SyncWorld) -> None:
    async with world.sessions() as s, s.begin():
        await enqueue_delta_poll(s, LINK, reason="test", dedupe_window_seconds=0)
    await world.drain()


async def _statuses(world: SyncWorld) -> dict[str, str]:
    async with world.sessions() as s:
        rows = (await s.execute(select(synced_items))).mappings().all()
    return {r["upstream_item_id"]: r["status"] for r in rows}


async def _drive(world: SyncWorld) -> object:
    async with world.sessions() as s:
        return (
            (await s.execute(select(linked_drives).where(linked_drives.c.id == LINK)))
            .mappings()
            .one()
        )


def _item(item_id: str, **kw: object) -> dict[str, object]:
    return {"id": item_id, "name": f"{item_id}.txt", "size": 1, **kw}


async def test_pages_are_followed_and_the_delta_link_stored(world: SyncWorld) -> None:
    world.fake.set_delta(DRIVE, "", [[_item("a"), _item("b")], [_item("c")]], next_token="t1")
    await _link_drive(world, None)
    await _poll(world)
    assert await _statuses(world) == {"a": SYNCED, "b": SYNCED, "c": SYNCED}
    drive = await _drive(world)
    assert drive["delta_link"] == world.fake.delta_url(DRIVE, "t1")  # type: ignore[index]
    assert len(world.fake.delta_calls(DRIVE)) == 2

    # Replaying the same changes (an unchanged page) is harmless.
    world.fake.set_delta(DRIVE, "t1", [[_item("a"), _item("b")]], next_token="t2")
    await _poll(world)
    assert await _statuses(world) == {"a": SYNCED, "b": SYNCED, "c": SYNCED}


async def test_removed_tombstones_without_item_gets(world: SyncWorld) -> None:
    world.fake.set_delta(DRIVE, "", [[_item("a"), _item("b")]], next_token="t1")
    await _link_drive(world, None)
    await _poll(world)
    world.fake.set_delta(
        DRIVE,
        "t1",
        [[{"id": "a", "@removed": {"reason": "deleted"}}, {"id": "b", "deleted": {}}]],
        next_token="t2",
    )
    await _poll(world)
    assert await _statuses(world) == {"a": TOMBSTONED, "b": TOMBSTONED}
    assert [c for c in world.fake.calls if c.kind == "item"] == []

    # A replayed page that lists the item again never resurrects the tombstone.
    world.fake.set_delta(DRIVE, "t2", [[_item("a")]], next_token="t3")
    await _poll(world)
    assert (await _statuses(world))["a"] == TOMBSTONED


async def test_expired_cursor_means_full_resync_not_deletion(world: SyncWorld) -> None:
    world.fake.set_delta(DRIVE, "", [[_item("a"), _item("b"), _item("c")]], next_token="t1")
    await _link_drive(world, None)
    await _poll(world)
    for item in ("a", "b", "c"):
        world.fake.put_item(DRIVE, item)

    # The cursor expires; the fresh enumeration no longer lists "c" (paged out, lagging).
    world.fake.expire(DRIVE, "t1")
    world.fake.set_delta(DRIVE, "", [[_item("a")], [_item("b")]], next_token="t9")
    await _poll(world)

    statuses = await _statuses(world)
    assert TOMBSTONED not in statuses.values()
    assert statuses == {"a": SYNCED, "b": SYNCED, "c": SYNCED}
    drive = await _drive(world)
    assert drive["full_resync_count"] == 1  # type: ignore[index]
    assert drive["delta_link"] == world.fake.delta_url(DRIVE, "t9")  # type: ignore[index]
    # The unseen item was re-checked with a GET, which found it alive.
    assert len(world.fake.item_calls(DRIVE, "c")) == 1
    assert world.fake.item_calls(DRIVE, "a") == []


async def test_unseen_item_that_is_gone_is_tombstoned_by_its_own_410(world: SyncWorld) -> None:
    world.fake.set_delta(DRIVE, "", [[_item("a"), _item("z")]], next_token="t1")
    await _link_drive(world, None)
    await _poll(world)
    world.fake.expire(DRIVE, "t1")
    world.fake.set_delta(DRIVE, "", [[_item("a")]], next_token="t2")
    world.fake.always(DRIVE, "z", 410)
    await _poll(world)
    assert await _statuses(world) == {"a": SYNCED, "z": TOMBSTONED}
    assert len(world.fake.item_calls(DRIVE, "z")) == 1
