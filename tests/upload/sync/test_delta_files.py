"""Items found only by a delta become files; purge retires tombstoned files (both DBs).

A drive linked into a folder: each new upstream item is a file there, owned by the
folder's owner (the link's owner), NFC-named, unique per folder ("name (2).ext" on a
clash), with version 1 and its outbox event; a replayed page creates nothing twice; one
tenant's link never writes into another's tree. Purge past retention deletes the
tombstoned file with its tombstone (file.deleted, then the terminal file.purged), so
nothing shows it again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from serentak.events.v1 import events_pb2
from serentak.upload.v1 import sync_pb2, sync_pb2_grpc, upload_pb2, upload_pb2_grpc
from sqlalchemy import select, update
from support.grpc_errors import error_info
from upload.sync.sync_server import ALICE, BOB, MALLORY, sync_server
from upload.sync.sync_world import ACCOUNT, DRIVE, SyncWorld

from services.common.outbox.models import outbox_events
from services.upload.files.retire import retire_files
from services.upload.sync.materialize import usable_name
from services.upload.sync.models import TOMBSTONED, synced_items, utcnow
from services.upload.sync.purge import purge


@pytest.fixture
async def channel(world: SyncWorld, tmp_path: Path) -> AsyncIterator[grpc.aio.Channel]:
    """SyncService + FileService on loopback."""
    async with sync_server(world, tmp_path) as ch:
        yield ch


def _item(item_id: str, name: str, **kw: object) -> dict[str, object]:
    return {"id": item_id, "name": name, "size": 7, **kw}


async def _folder(channel: grpc.aio.Channel, who: tuple, name: str, parent: str = "") -> str:
    files = upload_pb2_grpc.FileServiceStub(channel)
    made = await files.CreateFolder(
        upload_pb2.CreateFolderRequest(name=name, parent_id=parent), metadata=who
    )
    return made.file_id


async def _link(channel: grpc.aio.Channel, who: tuple, folder: str) -> str:
    sync = sync_pb2_grpc.SyncServiceStub(channel)
    drive = await sync.LinkDrive(
        sync_pb2.LinkDriveRequest(account_id=ACCOUNT, upstream_drive_id=DRIVE, folder_id=folder),
        metadata=who,
    )
    return drive.linked_drive_id


async def _listing(channel: grpc.aio.Channel, who: tuple, folder: str) -> dict[str, object]:
    files = upload_pb2_grpc.FileServiceStub(channel)
    page = await files.ListFolder(upload_pb2.ListFolderRequest(folder_id=folder), metadata=who)
    return {f.name: f for f in page.files}


async def _events(world: SyncWorld, event_type: str) -> list[events_pb2.Event]:
    async with world.sessions() as s:
        blobs = (
            await s.execute(
                select(outbox_events.c.event).where(outbox_events.c.event_type == event_type)
            )
        ).scalars()
        return [events_pb2.Event.FromString(b) for b in blobs]


def test_usable_name() -> None:
    assert usable_name("e\u0301te\u0301.txt", "x") == "\u00e9t\u00e9.txt"
    assert usable_name("a/b\x00c\x07.txt", "x") == "a_b_c_.txt"
    assert usable_name("  ", "id9") == "item-id9"
    assert usable_name("..", "id9") == "item-id9"
    assert len(usable_name("n" * 400, "x")) == 255


async def test_delta_items_become_files_in_the_drive_folder(
    world: SyncWorld, channel: grpc.aio.Channel
) -> None:
    files = upload_pb2_grpc.FileServiceStub(channel)
    docs = await _folder(channel, ALICE, "docs")
    # A folder of alice's already holds "report.txt": the upstream file must not take it.
    await _folder(channel, ALICE, "report.txt", parent=docs)
    await files.ShareFile(
        upload_pb2.ShareFileRequest(file_id=docs, user_id="bob", role=upload_pb2.ROLE_EDITOR),
        metadata=ALICE,
    )
    # Another tenant links the same upstream drive into its own folder.
    evil_folder = await _folder(channel, MALLORY, "mine")
    page = [
        _item("i1", "report.txt"),
        _item("i2", "cafe\u0301.txt"),
        _item("i3", "a/b.txt"),
        _item("i4", "caf\u00e9.txt"),  # the NFC twin of i2: a clash after normalising
    ]
    world.fake.set_delta(DRIVE, "", [page], next_token="t1")
    world.fake.set_delta(DRIVE, "t1", [page], next_token="t2")  # a replayed page
    bob_link = await _link(channel, BOB, docs)  # an editor links: alice owns the files
    await _link(channel, MALLORY, evil_folder)
    await world.drain()
    sync = sync_pb2_grpc.SyncServiceStub(channel)
    await sync.TriggerSync(sync_pb2.TriggerSyncRequest(linked_drive_id=bob_link), metadata=BOB)
    await world.drain()

    listed = await _listing(channel, ALICE, docs)
    assert set(listed) == {
        "report.txt",  # alice's folder
        "report (2).txt",
        "caf\u00e9.txt",
        "caf\u00e9 (2).txt",
        "a_b.txt",
    }
    for name in ("report (2).txt", "caf\u00e9.txt", "caf\u00e9 (2).txt", "a_b.txt"):
        f = listed[name]
        assert f.kind == upload_pb2.FILE_KIND_FILE
        assert (f.owner_user_id, f.tenant_id, f.version, f.size) == ("alice", "acme", 1, 7)
    # Mallory's tenant got its own four files, in its own folder only.
    evil = await _listing(channel, MALLORY, evil_folder)
    assert len(evil) == 4 and {f.tenant_id for f in evil.values()} == {"evil"}
    # One event per created file (none for the replay), at version 1, bob as the actor.
    created = await _events(world, "file.content.updated")
    acme = [e for e in created if e.tenant_id == "acme"]
    assert len(acme) == 4 and len(created) == 8
    assert {e.actor_user_id for e in acme} == {"bob"}
    assert {e.version for e in created} == {1}
    assert {e.file_content_updated.name for e in acme} == set(listed) - {"report.txt"}
    # Synced rows name their files.
    async with world.sessions() as s:
        rows = (await s.execute(select(synced_items))).mappings().all()
    assert len(rows) == 8 and all(r["file_id"] for r in rows)


async def test_no_file_when_the_folder_is_deleted(
    world: SyncWorld, channel: grpc.aio.Channel
) -> None:
    files = upload_pb2_grpc.FileServiceStub(channel)
    docs = await _folder(channel, ALICE, "docs")
    world.fake.set_delta(DRIVE, "", [[_item("i1", "x.txt")]], next_token="t1")
    await _link(channel, ALICE, docs)
    await files.DeleteFile(upload_pb2.DeleteFileRequest(file_id=docs), metadata=ALICE)
    await world.drain()
    async with world.sessions() as s:
        rows = (await s.execute(select(synced_items))).mappings().all()
    assert [(r["upstream_item_id"], r["file_id"]) for r in rows] == [("i1", None)]
    assert await _events(world, "file.content.updated") == []


async def test_purge_retires_tombstoned_files(world: SyncWorld, channel: grpc.aio.Channel) -> None:
    files = upload_pb2_grpc.FileServiceStub(channel)
    docs = await _folder(channel, ALICE, "docs")
    world.fake.set_delta(DRIVE, "", [[_item("i1", "gone.txt"), _item("i2", "kept.txt")]], "t1")
    world.fake.set_delta(DRIVE, "t1", [[{"id": "i1", "@removed": {"reason": "deleted"}}]], "t2")
    link = await _link(channel, ALICE, docs)
    await world.drain()
    gone = (await _listing(channel, ALICE, docs))["gone.txt"]
    await files.ShareFile(
        upload_pb2.ShareFileRequest(
            file_id=gone.file_id, user_id="bob", role=upload_pb2.ROLE_VIEWER
        ),
        metadata=ALICE,
    )
    sync = sync_pb2_grpc.SyncServiceStub(channel)
    await sync.TriggerSync(sync_pb2.TriggerSyncRequest(linked_drive_id=link), metadata=ALICE)
    await world.drain()
    # Tombstoned: hidden, FILE_RETENTION_EXPIRED.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await files.GetFile(upload_pb2.GetFileRequest(file_id=gone.file_id), metadata=ALICE)
    assert error_info(err.value).reason == "FILE_RETENTION_EXPIRED"
    assert set(await _listing(channel, ALICE, docs)) == {"kept.txt"}

    retention = world.engine.settings.retention_seconds
    async with world.sessions() as s, s.begin():
        await s.execute(
            update(synced_items)
            .where(synced_items.c.status == TOMBSTONED)
            .values(tombstoned_at=utcnow() - timedelta(seconds=retention + 60))
        )
    engine = dataclasses.replace(world.engine, retire_files=retire_files)
    async with world.sessions() as s, s.begin():
        result = await purge(engine, s)
    assert (result.rows_deleted, result.rows_kept) == (1, 0)
    # The file went with its tombstone: nothing can show it again, nor restore it.
    for who in (ALICE, BOB):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await files.GetFile(upload_pb2.GetFileRequest(file_id=gone.file_id), metadata=who)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await files.RestoreFile(upload_pb2.RestoreFileRequest(file_id=gone.file_id), metadata=ALICE)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    deleted = await _events(world, "file.deleted")
    assert [(e.aggregate_id, e.version, e.actor_user_id) for e in deleted] == [
        (gone.file_id, 3, "")  # created 1, shared 2, retired 3
    ]
    # The audience at deletion: the owner and the collaborator hear it.
    assert set(deleted[0].audience_user_ids) >= {"alice", "bob"}
    # Then the file's last event, told to nobody: subscribers may forget it.
    purged = await _events(world, "file.purged")
    assert [(e.aggregate_id, e.version, list(e.audience_user_ids)) for e in purged] == [
        (gone.file_id, 4, [])
    ]
    assert purged[0].file_purged.file_id == gone.file_id
    assert set(await _listing(channel, ALICE, docs)) == {"kept.txt"}
    async with world.sessions() as s:
        left = (await s.execute(select(synced_items.c.upstream_item_id))).scalars().all()
    assert left == ["i2"]
    # Another run finds nothing more.
    async with world.sessions() as s, s.begin():
        again = await purge(engine, s)
    assert (again.rows_deleted, again.rows_kept) == (0, 0)


async def test_retire_keeps_folders_and_forgets_missing_files(
    world: SyncWorld, channel: grpc.aio.Channel
) -> None:
    docs = await _folder(channel, ALICE, "docs")
    async with world.sessions() as s, s.begin():
        gone = await retire_files(s, [docs, "f" * 32])
    assert gone == {"f" * 32}
    assert "docs" in await _listing(channel, ALICE, "")
