"""Delta polls against the fake provider: @removed, next links, an expired cursor."""

from __future__ import annotations

from sqlalchemy import select
from upload.sync.sync_world import DRIVE, SyncWorld

from services.upload.sync.models import SYNCED, TOMBSTONED, linked_drives, synced_items

LINK = "link-1"


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
    await world.link_drive(LINK)
    await world.poll(LINK)
    assert await _statuses(world) == {"a": SYNCED, "b": SYNCED, "c": SYNCED}
    drive = await _drive(world)
    assert drive["delta_link"] == world.fake.delta_url(DRIVE, "t1")  # type: ignore[index]
    assert len(world.fake.delta_calls(DRIVE)) == 2

    # Replaying the same changes (an unchanged page) is harmless.
    world.fake.set_delta(DRIVE, "t1", [[_item("a"), _item("b")]], next_token="t2")
    await world.poll(LINK)
    assert await _statuses(world) == {"a": SYNCED, "b": SYNCED, "c": SYNCED}


async def test_removed_tombstones_without_item_gets(world: SyncWorld) -> None:
    world.fake.set_delta(DRIVE, "", [[_item("a"), _item("b")]], next_token="t1")
    await world.link_drive(LINK)
    await world.poll(LINK)
    world.fake.set_delta(
        DRIVE,
        "t1",
        [[{"id": "a", "@removed": {"reason": "deleted"}}, {"id": "b", "deleted": {}}]],
        next_token="t2",
    )
    await world.poll(LINK)
    assert await _statuses(world) == {"a": TOMBSTONED, "b": TOMBSTONED}
    assert [c for c in world.fake.calls if c.kind == "item"] == []

    # A replayed page that lists the item again never resurrects the tombstone.
    world.fake.set_delta(DRIVE, "t2", [[_item("a")]], next_token="t3")
    await world.poll(LINK)
    assert (await _statuses(world))["a"] == TOMBSTONED


async def test_expired_cursor_means_full_resync_not_deletion(world: SyncWorld) -> None:
    world.fake.set_delta(DRIVE, "", [[_item("a"), _item("b"), _item("c")]], next_token="t1")
    await world.link_drive(LINK)
    await world.poll(LINK)
    for item in ("a", "b", "c"):
        world.fake.put_item(DRIVE, item)

    # The cursor expires; the fresh enumeration no longer lists "c" (paged out, lagging).
    world.fake.expire(DRIVE, "t1")
    world.fake.set_delta(DRIVE, "", [[_item("a")], [_item("b")]], next_token="t9")
    await world.poll(LINK)

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
    await world.link_drive(LINK)
    await world.poll(LINK)
    world.fake.expire(DRIVE, "t1")
    world.fake.set_delta(DRIVE, "", [[_item("a")]], next_token="t2")
    world.fake.always(DRIVE, "z", 410)
    await world.poll(LINK)
    assert await _statuses(world) == {"a": SYNCED, "z": TOMBSTONED}
    assert len(world.fake.item_calls(DRIVE, "z")) == 1
