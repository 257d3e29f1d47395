"""SyncService over real gRPC, and a tombstoned file answered FILE_RETENTION_EXPIRED."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from serentak.upload.v1 import sync_pb2, sync_pb2_grpc, upload_pb2, upload_pb2_grpc
from upload.sync.sync_server import ALICE, MALLORY, sync_server
from upload.sync.sync_world import DRIVE, SyncWorld

from services.common.auth import Authenticator


@pytest.fixture
async def channel(world: SyncWorld, tmp_path: Path) -> AsyncIterator[grpc.aio.Channel]:
    """A channel to a server running SyncService and the upload service's FileService."""
    async with sync_server(world, tmp_path) as ch:
        yield ch


async def _folder(channel: grpc.aio.Channel, name: str = "synced") -> str:
    """A folder alice owns (the local file a synced item backs)."""
    files = upload_pb2_grpc.FileServiceStub(channel)
    made = await files.CreateFolder(upload_pb2.CreateFolderRequest(name=name), metadata=ALICE)
    return made.file_id


def _error_info(err: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    status = rpc_status.from_call(err)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    return info


async def test_tombstoned_file_answers_file_retention_expired(
    world: SyncWorld, channel: grpc.aio.Channel
) -> None:
    sync = sync_pb2_grpc.SyncServiceStub(channel)
    files = upload_pb2_grpc.FileServiceStub(channel)
    file_id = await _folder(channel)
    world.fake.always(DRIVE, "gone-9", 410)
    item = await sync.LinkItem(
        sync_pb2.LinkItemRequest(
            account_id="acct-1",
            upstream_drive_id=DRIVE,
            upstream_item_id="gone-9",
            file_id=file_id,
        ),
        metadata=ALICE,
    )
    await files.GetFile(upload_pb2.GetFileRequest(file_id=file_id), metadata=ALICE)
    await world.drain()

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await files.GetFile(upload_pb2.GetFileRequest(file_id=file_id), metadata=ALICE)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    info = _error_info(caught.value)
    assert info.reason == "FILE_RETENTION_EXPIRED"
    assert info.metadata["status"] == "expired"

    status = await sync.GetSyncStatus(
        sync_pb2.GetSyncStatusRequest(file_id=file_id), metadata=ALICE
    )
    assert status.item.status == sync_pb2.SYNC_ITEM_STATUS_TOMBSTONED
    assert status.item.tombstone_reason == "gone"
    # Triggering a tombstone queues nothing and calls nobody.
    again = await sync.TriggerSync(
        sync_pb2.TriggerSyncRequest(synced_item_id=item.synced_item_id), metadata=ALICE
    )
    assert not again.queued
    assert len(world.fake.item_calls(DRIVE, "gone-9")) == 1


async def test_link_drive_polls_and_reports(world: SyncWorld, channel: grpc.aio.Channel) -> None:
    sync = sync_pb2_grpc.SyncServiceStub(channel)
    world.fake.set_delta(DRIVE, "", [[{"id": "a", "name": "a"}]], next_token="t1")
    drive = await sync.LinkDrive(
        sync_pb2.LinkDriveRequest(account_id="acct-1", upstream_drive_id=DRIVE), metadata=ALICE
    )
    await world.drain()
    status = await sync.GetSyncStatus(
        sync_pb2.GetSyncStatusRequest(linked_drive_id=drive.linked_drive_id), metadata=ALICE
    )
    assert status.drive.has_delta_cursor
    assert status.drive.synced_count == 1

    with pytest.raises(grpc.aio.AioRpcError) as dup:
        await sync.LinkDrive(
            sync_pb2.LinkDriveRequest(account_id="acct-1", upstream_drive_id=DRIVE),
            metadata=ALICE,
        )
    assert dup.value.code() == grpc.StatusCode.ALREADY_EXISTS
    # Another tenant cannot see it.
    with pytest.raises(grpc.aio.AioRpcError) as other:
        await sync.GetSyncStatus(
            sync_pb2.GetSyncStatusRequest(linked_drive_id=drive.linked_drive_id),
            metadata=MALLORY,
        )
    assert other.value.code() == grpc.StatusCode.NOT_FOUND


async def test_bad_input_is_invalid_argument_not_internal(channel: grpc.aio.Channel) -> None:
    sync = sync_pb2_grpc.SyncServiceStub(channel)
    bad = [
        sync.LinkItem(sync_pb2.LinkItemRequest(account_id="a"), metadata=ALICE),
        sync.TriggerSync(sync_pb2.TriggerSyncRequest(), metadata=ALICE),
        sync.GetSyncStatus(sync_pb2.GetSyncStatusRequest(), metadata=ALICE),
        sync.LinkDrive(
            sync_pb2.LinkDriveRequest(account_id="a", upstream_drive_id="x" * 300),
            metadata=ALICE,
        ),
        sync.LinkDrive(
            sync_pb2.LinkDriveRequest(account_id="a", upstream_drive_id="d", folder_id="f" * 33),
            metadata=ALICE,
        ),
        sync.LinkItem(
            sync_pb2.LinkItemRequest(
                account_id="a", upstream_drive_id="d", upstream_item_id="i", file_id="f" * 33
            ),
            metadata=ALICE,
        ),
    ]
    for call in bad:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as anon:
        await sync.GetSyncStatus(sync_pb2.GetSyncStatusRequest(file_id="x"))
    assert anon.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_wire_sync_registers_jobs_and_serves_webhooks(world: SyncWorld, tmp_path) -> None:
    import asyncio

    import httpx
    from support.ports import free_port

    from services.common.jobs.registry import JobRegistry
    from services.upload.sync.jobs import (
        DELTA_JOB,
        ITEM_JOB,
        PURGE_JOB,
        RECONCILE_JOB,
        SUBSCRIPTION_JOB,
        SUBSCRIPTIONS_JOB,
        UNSUBSCRIBE_JOB,
        periodic_schedules,
    )
    from services.upload.sync.wiring import wire_sync

    port = free_port()
    settings = world.engine.settings.model_copy(update={"webhook_port": port})
    registry = JobRegistry()
    auth = Authenticator.dev()
    wiring = wire_sync(settings, world.sessions, registry, auth, tmp_path / "cache")
    assert set(registry.names) == {
        DELTA_JOB,
        ITEM_JOB,
        PURGE_JOB,
        RECONCILE_JOB,
        SUBSCRIPTION_JOB,
        SUBSCRIPTIONS_JOB,
        UNSUBSCRIBE_JOB,
    }
    # No public webhook URL: the provider cannot reach us, so no subscriptions.
    assert {s.job_type for s in wiring.schedules} == {RECONCILE_JOB, PURGE_JOB}
    public = settings.model_copy(update={"webhook_public_url": "https://sync.example.com"})
    assert {s.job_type for s in periodic_schedules(public)} == {
        RECONCILE_JOB,
        PURGE_JOB,
        SUBSCRIPTIONS_JOB,
    }
    task = asyncio.create_task(wiring.webhook_server())
    try:
        url = f"http://127.0.0.1:{port}{settings.webhook_path}"
        async with httpx.AsyncClient() as client:
            deadline = asyncio.get_running_loop().time() + 10
            while True:
                try:
                    r = await client.post(url, params={"validationToken": "hello"})
                    break
                except httpx.ConnectError:
                    if asyncio.get_running_loop().time() > deadline:
                        raise
                    await asyncio.sleep(0.02)
        assert r.status_code == 200 and r.text == "hello"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await wiring.close()
