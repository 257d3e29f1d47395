"""Purge past retention, offline expiry via reconcile, and tombstone serving helpers."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update
from upload.sync.sync_world import SyncWorld

from services.upload.sync.errors import FileRetentionExpired
from services.upload.sync.models import SYNCED, TOMBSTONED, synced_items, utcnow
from services.upload.sync.purge import purge
from services.upload.sync.reconcile import reconcile
from services.upload.sync.tombstones import hidden_file_ids, raise_if_tombstoned


async def _tombstone(world: SyncWorld, item_id: str, age: timedelta) -> None:
    async with world.sessions() as s, s.begin():
        await s.execute(
            update(synced_items)
            .where(synced_items.c.id == item_id)
            .values(status=TOMBSTONED, tombstone_reason="gone", tombstoned_at=utcnow() - age)
        )


async def _ids(world: SyncWorld) -> set[str]:
    async with world.sessions() as s:
        return set((await s.execute(select(synced_items.c.id))).scalars())


async def test_purge_removes_only_tombstones_past_retention(world: SyncWorld) -> None:
    retention = timedelta(seconds=world.engine.settings.retention_seconds)
    old = await world.link_item("old", cache_key="c/old")
    young = await world.link_item("young", cache_key="c/young")
    alive = await world.link_item("alive", cache_key="c/alive")
    old_file = await world.link_item("old-file", file_id="f" * 32, cache_key="c/old-file")
    for key in ("c/old", "c/young", "c/alive", "c/old-file"):
        world.cache.store(key, b"x")
    await _tombstone(world, old, retention + timedelta(hours=1))
    await _tombstone(world, old_file, retention + timedelta(hours=1))
    await _tombstone(world, young, retention - timedelta(hours=1))

    async with world.sessions() as s, s.begin():
        result = await purge(world.engine, s)
    # The file-linked tombstone keeps its row (the file must stay hidden) but loses bytes.
    assert (result.rows_deleted, result.rows_kept, result.bytes_evicted) == (1, 1, 2)
    assert await _ids(world) == {young, alive, old_file}
    assert not world.cache.path("c/old").exists()
    assert not world.cache.path("c/old-file").exists()
    assert world.cache.path("c/young").exists() and world.cache.path("c/alive").exists()

    # A second run (another replica, the next tick) finds nothing left to do.
    async with world.sessions() as s, s.begin():
        again = await purge(world.engine, s)
    assert (again.rows_deleted, again.bytes_evicted) == (0, 0)


async def test_purge_with_retire_hook_deletes_file_linked_rows(world: SyncWorld) -> None:
    from dataclasses import replace

    offered: list[str] = []

    async def retire(_session: object, file_ids: list[str]) -> set[str]:
        offered.extend(file_ids)
        return {f for f in file_ids if f != "b" * 32}  # the hook keeps "b..." (a folder)

    engine = replace(world.engine, retire_files=retire)
    item = await world.link_item("f-old", file_id="a" * 32)
    kept = await world.link_item("f-kept", file_id="b" * 32)
    await _tombstone(world, item, timedelta(days=400))
    await _tombstone(world, kept, timedelta(days=401))
    async with world.sessions() as s, s.begin():
        result = await purge(engine, s)
    assert (result.rows_deleted, result.rows_kept) == (1, 1)
    assert sorted(offered) == ["a" * 32, "b" * 32]
    # A tombstone whose file was not retired stays: its file stays hidden.
    assert await _ids(world) == {kept}


async def test_reconcile_tombstones_expired_items_offline(world: SyncWorld) -> None:
    expired = await world.link_item("exp")
    fresh = await world.link_item("fresh")
    async with world.sessions() as s, s.begin():
        await s.execute(
            update(synced_items)
            .where(synced_items.c.id == expired)
            .values(expires_at=utcnow() - timedelta(minutes=1))
        )
        await s.execute(
            update(synced_items)
            .where(synced_items.c.id == fresh)
            .values(status=SYNCED, expires_at=utcnow() + timedelta(days=1))
        )
    async with world.sessions() as s, s.begin():
        counts = await reconcile(world.engine, s)
    assert counts["expired"] == 1
    assert (await world.item(expired))["status"] == TOMBSTONED
    assert (await world.item(fresh))["status"] == SYNCED
    assert world.fake.calls == []


async def test_tombstone_helpers(world: SyncWorld) -> None:
    gone = await world.link_item("gone", file_id="g" * 32)
    await world.link_item("kept", file_id="k" * 32)
    await _tombstone(world, gone, timedelta(0))
    async with world.sessions() as s:
        with pytest.raises(FileRetentionExpired) as err:
            await raise_if_tombstoned(s, "acme", "g" * 32)
        await raise_if_tombstoned(s, "acme", "k" * 32)
        await raise_if_tombstoned(s, "acme", "n" * 32)
        # Another tenant's file of the same id is not hidden by acme's tombstone.
        await raise_if_tombstoned(s, "other", "g" * 32)
        assert await hidden_file_ids(s, "acme") == {"g" * 32}
        assert await hidden_file_ids(s, "acme", ["k" * 32]) == set()
        assert await hidden_file_ids(s, "other") == set()
    assert err.value.reason == "FILE_RETENTION_EXPIRED"
    assert err.value.metadata["status"] == "expired"
