"""Races of the sync engine's writes into the file tree (both databases).

- A delta poll creating files races users creating folders of the same names in the same
  folder: names stay unique (the tree lock orders them; the loser is NAME_TAKEN or the
  synced file becomes "name (2)"), never INTERNAL.
- Two purgers (replicas) retire the same expired tombstones at once: every file is retired
  exactly once (one file.deleted event each), nothing fails.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from serentak.upload.v1 import sync_pb2, sync_pb2_grpc, upload_pb2, upload_pb2_grpc
from sqlalchemy import func, select, update
from support.grpc_errors import error_info
from upload.sync.sync_server import ALICE, sync_server
from upload.sync.sync_world import ACCOUNT, DRIVE, SyncWorld, settings

from services.common.outbox.models import outbox_events
from services.upload.files.retire import retire_files
from services.upload.sync.models import TOMBSTONED, synced_items, utcnow
from services.upload.sync.purge import purge
from services.upload.sync.settings import SyncSettings

NAMES = [f"n{i}.txt" for i in range(12)]


@pytest.fixture
def sync_settings() -> SyncSettings:
    """Delta polls run as soon as queued (no dedupe window): the race starts at once."""
    return settings(webhook_dedupe_seconds=0)


@pytest.fixture
async def channel(world: SyncWorld, tmp_path: Path) -> AsyncIterator[grpc.aio.Channel]:
    """SyncService + FileService on loopback."""
    async with sync_server(world, tmp_path) as ch:
        yield ch


async def _linked_folder(world: SyncWorld, channel: grpc.aio.Channel) -> str:
    files = upload_pb2_grpc.FileServiceStub(channel)
    docs = await files.CreateFolder(upload_pb2.CreateFolderRequest(name="docs"), metadata=ALICE)
    sync = sync_pb2_grpc.SyncServiceStub(channel)
    await sync.LinkDrive(
        sync_pb2.LinkDriveRequest(
            account_id=ACCOUNT, upstream_drive_id=DRIVE, folder_id=docs.file_id
        ),
        metadata=ALICE,
    )
    return docs.file_id


async def test_delta_files_race_user_folders_for_names(
    world: SyncWorld, channel: grpc.aio.Channel
) -> None:
    files = upload_pb2_grpc.FileServiceStub(channel)
    world.fake.set_delta(
        DRIVE, "", [[{"id": f"i{i}", "name": n, "size": 1} for i, n in enumerate(NAMES)]], "t1"
    )
    docs = await _linked_folder(world, channel)

    async def user_folder(name: str) -> str:
        try:
            await files.CreateFolder(
                upload_pb2.CreateFolderRequest(name=name, parent_id=docs), metadata=ALICE
            )
            return "created"
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.ALREADY_EXISTS, exc.details()
            assert error_info(exc).reason == "NAME_TAKEN"
            return "taken"

    outcomes = await asyncio.gather(world.drain(), *(user_folder(n) for n in NAMES))
    page = await files.ListFolder(
        upload_pb2.ListFolderRequest(folder_id=docs, page_size=100), metadata=ALICE
    )
    names = [f.name for f in page.files]
    assert len(names) == len(set(names))  # unique whoever won
    synced = [f for f in page.files if f.kind == upload_pb2.FILE_KIND_FILE]
    assert len(synced) == len(NAMES)  # every upstream item got its file
    for name, outcome in zip(NAMES, outcomes[1:], strict=True):
        stem = name.removesuffix(".txt")
        if outcome == "created":
            assert f"{stem} (2).txt" in names  # the user's folder came first
        else:
            assert name in {f.name for f in synced}  # the synced file came first


async def test_two_purgers_retire_each_file_once(
    world: SyncWorld, channel: grpc.aio.Channel
) -> None:
    world.fake.set_delta(
        DRIVE, "", [[{"id": f"i{i}", "name": n, "size": 1} for i, n in enumerate(NAMES)]], "t1"
    )
    await _linked_folder(world, channel)
    await world.drain()
    old = utcnow() - timedelta(seconds=world.engine.settings.retention_seconds + 60)
    async with world.sessions() as s, s.begin():
        await s.execute(
            update(synced_items).values(
                status=TOMBSTONED, tombstone_reason="gone", tombstoned_at=old
            )
        )
    engine = dataclasses.replace(
        world.engine,
        retire_files=retire_files,
        settings=world.engine.settings.model_copy(update={"purge_batch_size": 3}),
    )

    async def purger() -> int:
        async with world.sessions() as s, s.begin():
            return (await purge(engine, s)).rows_deleted

    deleted = await asyncio.gather(purger(), purger())
    assert sum(deleted) == len(NAMES)
    async with world.sessions() as s:
        events = (
            await s.execute(
                select(outbox_events.c.aggregate_id, func.count())
                .where(outbox_events.c.event_type == "file.deleted")
                .group_by(outbox_events.c.aggregate_id)
            )
        ).all()
        left = (await s.execute(select(func.count()).select_from(synced_items))).scalar()
    assert len(events) == len(NAMES) and {n for _, n in events} == {1}
    assert left == 0
