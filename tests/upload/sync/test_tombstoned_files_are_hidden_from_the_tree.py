"""Upstream sync wired into the upload service (issue 8): a real uploaded file linked to an
upstream item that answers 410 Gone is tombstoned by the service's own job workers; then
GetFile and Download answer FAILED_PRECONDITION / FILE_RETENTION_EXPIRED (status=expired),
ListFolder (cached or not) leaves it out, and every row is kept."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from serentak.upload.v1 import upload_pb2
from sqlalchemy import select
from upload.change_helpers import FeedCopy, view
from upload.sync.fake_provider import FakeProvider
from upload.upload_helpers import (
    chunk_request,
    create_request,
    download,
    expect_error,
    wait_status,
)

from services.common.db import create_engine, session_factory
from services.upload.models import FileRow
from services.upload.sync import items
from services.upload.sync.jobs import enqueue_item_sync
from services.upload.sync.models import TOMBSTONED, synced_items, utcnow
from services.upload.sync.settings import SyncSettings

DRIVE = "drv-e2e"


@pytest.fixture
async def fake() -> AsyncIterator[FakeProvider]:
    async with FakeProvider() as provider:
        yield provider


@pytest.fixture
def sync_settings(fake: FakeProvider) -> SyncSettings:
    return SyncSettings(
        webhook_port=0,
        provider_base_url=fake.base_url,
        provider_tokens={"acme": "test-token"},
        transient_backoff_base_seconds=0.05,
    )


async def _listed(client, folder_id: str) -> list[str]:
    page = await client.files.ListFolder(
        upload_pb2.ListFolderRequest(folder_id=folder_id), metadata=client.metadata
    )
    return [f.file_id for f in page.files]


async def test_a_410_upstream_tombstones_the_served_file(cluster, fake) -> None:
    alice = cluster["alice"]
    data = b"synced bytes"
    upload = await alice.uploads.CreateUpload(
        create_request(data, 1024, name="synced.txt"), metadata=alice.metadata
    )
    await alice.uploads.PutChunk(chunk_request(upload.upload_id, 0, data), metadata=alice.metadata)
    done = await wait_status(alice, upload.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    file = await alice.files.GetFile(
        upload_pb2.GetFileRequest(file_id=done.file_id), metadata=alice.metadata
    )
    # Cached before the tombstone: the stale page must not be served afterwards.
    assert done.file_id in await _listed(alice, file.parent_id)
    feed = FeedCopy(alice)
    await feed.catch_up()
    assert done.file_id in feed.items()

    fake.always(DRIVE, "up-1", 410)
    engine = create_engine(cluster.settings.database_url)
    sessions = session_factory(engine)
    try:
        async with sessions.begin() as session:
            item_id = await items.insert_item(
                session,
                tenant_id="acme",
                account_id="acct",
                upstream_drive_id=DRIVE,
                upstream_item_id="up-1",
                now=utcnow(),
                file_id=done.file_id,
            )
            await enqueue_item_sync(session, item_id, reason="test")
        deadline = time.monotonic() + 30
        while True:
            async with sessions() as session:
                status = await session.scalar(
                    select(synced_items.c.status).where(synced_items.c.id == item_id)
                )
            if status == TOMBSTONED:
                break
            assert time.monotonic() < deadline, f"item still {status}"
            await asyncio.sleep(0.05)

        for call in (
            alice.files.GetFile(
                upload_pb2.GetFileRequest(file_id=done.file_id), metadata=alice.metadata
            ),
            download(alice, done.file_id),
        ):
            info = await expect_error(
                call, grpc.StatusCode.FAILED_PRECONDITION, "FILE_RETENTION_EXPIRED"
            )
            assert info.metadata["status"] == "expired"
            assert info.metadata["file_id"] == done.file_id
        # Another tenant still learns nothing about the file.
        mallory = cluster["mallory"]
        await expect_error(
            mallory.files.GetFile(
                upload_pb2.GetFileRequest(file_id=done.file_id), metadata=mallory.metadata
            ),
            grpc.StatusCode.NOT_FOUND,
            "FILE_NOT_FOUND",
        )
        assert done.file_id not in await _listed(alice, file.parent_id)
        # ListChanges says it is gone too (a tombstone, kind deleted).
        await feed.catch_up()
        assert feed.received[-1] == (upload_pb2.CHANGE_KIND_DELETED, done.file_id, True)
        assert feed.items() == await view(alice)
        # One upstream call: 410 is terminal.
        assert len(fake.item_calls(DRIVE, "up-1")) == 1
        async with sessions() as session:
            kept = await session.get(FileRow, done.file_id)
            assert kept is not None and kept.deleted_at is None and kept.size == len(data)
            assert await session.scalar(
                select(synced_items.c.id).where(synced_items.c.file_id == done.file_id)
            )
        assert (cluster.settings.blob_root / "files" / done.file_id / done.upload_id).exists()
    finally:
        await engine.dispose()
