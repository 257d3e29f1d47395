"""Issue 11 item 3: upstream sync never crosses tenants.

Linking needs write access to the file (another tenant: NOT_FOUND, a viewer:
PERMISSION_DENIED); one tenant's tombstone never hides another tenant's file; a delta
poll reads and writes only its own tenant's rows, with its own tenant's credential; a
tenant without a credential gets FAILED_PRECONDITION and nothing is queued.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from serentak.upload.v1 import sync_pb2, sync_pb2_grpc, upload_pb2, upload_pb2_grpc
from sqlalchemy import select
from support.grpc_errors import error_info
from upload.sync.sync_server import ALICE, BOB, MALLORY, sync_server
from upload.sync.sync_world import ACCOUNT, DRIVE, OTHER_TENANT, TENANT, TOKENS, SyncWorld

from services.upload.sync import items
from services.upload.sync.models import SYNCED, linked_drives, synced_items, utcnow


@pytest.fixture
async def channel(world: SyncWorld, tmp_path: Path) -> AsyncIterator[grpc.aio.Channel]:
    """SyncService + FileService on loopback."""
    async with sync_server(world, tmp_path) as ch:
        yield ch


async def _expect(call, code: grpc.StatusCode, reason: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == code, caught.value.details()
    assert error_info(caught.value).reason == reason


async def _shared_folder(channel: grpc.aio.Channel) -> str:
    """A folder of alice's, shared with bob as a viewer."""
    files = upload_pb2_grpc.FileServiceStub(channel)
    folder = await files.CreateFolder(upload_pb2.CreateFolderRequest(name="docs"), metadata=ALICE)
    await files.ShareFile(
        upload_pb2.ShareFileRequest(
            file_id=folder.file_id, user_id="bob", role=upload_pb2.ROLE_VIEWER
        ),
        metadata=ALICE,
    )
    return folder.file_id


async def _tombstoned(world: SyncWorld, tenant_id: str, upstream_item: str, file_id: str) -> None:
    """A tombstoned synced item of `tenant_id` naming `file_id`."""
    async with world.sessions() as s, s.begin():
        item_id = await items.insert_item(
            s,
            tenant_id=tenant_id,
            account_id=ACCOUNT,
            upstream_drive_id=DRIVE,
            upstream_item_id=upstream_item,
            file_id=file_id,
            now=utcnow(),
        )
        await items.tombstone(s, item_id, "gone", utcnow())


def _link(file_id: str, item: str = "up-1") -> sync_pb2.LinkItemRequest:
    return sync_pb2.LinkItemRequest(
        account_id=ACCOUNT, upstream_drive_id=DRIVE, upstream_item_id=item, file_id=file_id
    )


async def test_link_item_needs_write_access_on_the_file(
    world: SyncWorld, channel: grpc.aio.Channel
) -> None:
    sync = sync_pb2_grpc.SyncServiceStub(channel)
    folder = await _shared_folder(channel)
    link_drive = sync_pb2.LinkDriveRequest(
        account_id=ACCOUNT, upstream_drive_id=DRIVE, folder_id=folder
    )
    not_found = (grpc.StatusCode.NOT_FOUND, "FILE_NOT_FOUND")
    denied = (grpc.StatusCode.PERMISSION_DENIED, "INSUFFICIENT_ROLE")
    # Another tenant (with its own provider credential) learns nothing about the file; a
    # viewer may read it but neither back it with upstream content nor mirror a drive into it.
    for call, request, caller, (code, reason) in (
        (sync.LinkItem, _link(folder), MALLORY, not_found),
        (sync.LinkItem, _link(folder), BOB, denied),
        (sync.LinkDrive, link_drive, BOB, denied),
        (sync.LinkDrive, link_drive, MALLORY, not_found),
    ):
        await _expect(call(request, metadata=caller), code, reason)
    assert await world.open_jobs() == []
    async with world.sessions() as s:
        assert (await s.execute(select(synced_items.c.id))).first() is None
    # The owner may.
    linked = await sync.LinkItem(_link(folder), metadata=ALICE)
    assert linked.file_id == folder
    assert len(await world.open_jobs()) == 1


async def test_a_tombstone_of_one_tenant_never_hides_another_tenants_file(
    world: SyncWorld, channel: grpc.aio.Channel
) -> None:
    files = upload_pb2_grpc.FileServiceStub(channel)
    parent = await files.CreateFolder(upload_pb2.CreateFolderRequest(name="p"), metadata=ALICE)
    child = await files.CreateFolder(
        upload_pb2.CreateFolderRequest(parent_id=parent.file_id, name="c"), metadata=ALICE
    )
    # A tombstone in tenant "evil" naming acme's file id (as a cross-tenant LinkItem used
    # to be able to create).
    await _tombstoned(world, OTHER_TENANT, "evil-1", child.file_id)
    got = await files.GetFile(upload_pb2.GetFileRequest(file_id=child.file_id), metadata=ALICE)
    assert got.file_id == child.file_id
    page = await files.ListFolder(
        upload_pb2.ListFolderRequest(folder_id=parent.file_id), metadata=ALICE
    )
    assert [f.file_id for f in page.files] == [child.file_id]
    # acme's own tombstone does hide it.
    await _tombstoned(world, TENANT, "acme-1", child.file_id)
    await _expect(
        files.GetFile(upload_pb2.GetFileRequest(file_id=child.file_id), metadata=ALICE),
        grpc.StatusCode.FAILED_PRECONDITION,
        "FILE_RETENTION_EXPIRED",
    )
    page = await files.ListFolder(
        upload_pb2.ListFolderRequest(folder_id=parent.file_id), metadata=ALICE
    )
    assert list(page.files) == []


async def _rows(world: SyncWorld, tenant: str) -> dict[str, dict[str, object]]:
    async with world.sessions() as s:
        rows = (
            await s.execute(select(synced_items).where(synced_items.c.tenant_id == tenant))
        ).mappings()
        return {r["upstream_item_id"]: dict(r) for r in rows}


async def test_a_delta_poll_never_touches_another_tenants_rows(world: SyncWorld) -> None:
    """Two tenants link the same account id and drive: each poll sees only its own rows."""
    await world.link_drive("link-a", TENANT)
    await world.link_drive("link-b", OTHER_TENANT)
    # Tenant B knows items "x" and "y" (synced earlier with B's credential).
    world.fake.set_delta(
        DRIVE, "", [[{"id": "x", "name": "b-x"}, {"id": "y", "name": "b-y"}]], next_token="b1"
    )
    await world.poll("link-b")
    before = await _rows(world, OTHER_TENANT)
    assert {k: v["status"] for k, v in before.items()} == {"x": SYNCED, "y": SYNCED}
    # Tenant A's delta says "x" is removed and renames "y".
    world.fake.set_delta(
        DRIVE,
        "",
        [[{"id": "x", "@removed": {"reason": "deleted"}}, {"id": "y", "name": "a-y"}]],
        next_token="a1",
    )
    await world.poll("link-a")
    assert await _rows(world, OTHER_TENANT) == before
    mine = await _rows(world, TENANT)
    # "x" was never A's: nothing to tombstone; "y" is A's own new row.
    assert set(mine) == {"y"}
    assert mine["y"]["name"] == "a-y" and mine["y"]["drive_id"] == "link-a"
    # Each poll carried its own tenant's credential.
    tokens = [c.token for c in world.fake.delta_calls(DRIVE)]
    assert tokens == [TOKENS[OTHER_TENANT], TOKENS[TENANT]]


async def test_a_tenant_without_a_credential_sends_nothing_upstream(world: SyncWorld) -> None:
    """A drive whose tenant has no credential (any more) dead-letters without a request."""
    await world.link_drive("link-c", "nocred")
    await world.poll("link-c")
    assert world.fake.calls == []
    dead = await world.dead()
    assert len(dead) == 1 and "no provider credential" in dead[0]["error_message"]


async def test_no_provider_credential_is_failed_precondition_and_queues_nothing(
    world: SyncWorld, tmp_path: Path
) -> None:
    bare = dataclasses.replace(
        world.engine, settings=world.engine.settings.model_copy(update={"provider_tokens": {}})
    )
    async with sync_server(world, tmp_path, engine=bare) as channel:
        sync = sync_pb2_grpc.SyncServiceStub(channel)
        files = upload_pb2_grpc.FileServiceStub(channel)
        folder = await files.CreateFolder(upload_pb2.CreateFolderRequest(name="d"), metadata=ALICE)
        # Linked while the tenant still had a credential: a trigger now would only fail.
        known = await world.link_item("old-1")
        calls = [
            sync.LinkDrive(
                sync_pb2.LinkDriveRequest(account_id=ACCOUNT, upstream_drive_id=DRIVE),
                metadata=ALICE,
            ),
            sync.LinkItem(_link(folder.file_id), metadata=ALICE),
            sync.LinkItem(_link("", item="up-2"), metadata=ALICE),
            sync.TriggerSync(sync_pb2.TriggerSyncRequest(synced_item_id=known), metadata=ALICE),
        ]
        for call in calls:
            await _expect(call, grpc.StatusCode.FAILED_PRECONDITION, "SYNC_PROVIDER_NOT_CONFIGURED")
    assert await world.open_jobs() == []
    async with world.sessions() as s:
        assert (await s.execute(select(linked_drives.c.id))).first() is None
        assert (await s.execute(select(synced_items.c.id))).scalars().all() == [known]
    assert world.fake.calls == []


async def test_two_tenants_may_link_the_same_upstream_ids(
    world: SyncWorld, channel: grpc.aio.Channel
) -> None:
    """Uniqueness is per tenant: one tenant's link never blocks (or reveals) another's."""
    sync = sync_pb2_grpc.SyncServiceStub(channel)
    request = sync_pb2.LinkDriveRequest(account_id=ACCOUNT, upstream_drive_id=DRIVE)
    a = await sync.LinkDrive(request, metadata=ALICE)
    b = await sync.LinkDrive(request, metadata=MALLORY)
    assert a.linked_drive_id != b.linked_drive_id
    item = sync_pb2.LinkItemRequest(
        account_id=ACCOUNT, upstream_drive_id=DRIVE, upstream_item_id="i"
    )
    await sync.LinkItem(item, metadata=ALICE)
    await sync.LinkItem(item, metadata=MALLORY)
    async with world.sessions() as s:
        tenants = (await s.execute(select(synced_items.c.tenant_id))).scalars().all()
    assert sorted(tenants) == sorted([TENANT, OTHER_TENANT])
