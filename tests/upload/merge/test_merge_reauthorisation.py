"""Unsharing or deleting stops an in-flight upload (issue 11, item 2).

The merge's commit re-checks, under the file lock and in the transaction that would
commit, that the uploader may still write the file (or the new file's folder) and that it
is not deleted; PutChunk re-checks too. A refused merge ends the upload `failed` with the
reason, and nothing of it becomes visible: no new version, no event, no merged blob."""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import grpc
from serentak.sdk.locks import LockClient
from serentak.upload.v1 import upload_pb2
from sqlalchemy import select
from upload.upload_helpers import (
    chunk_request,
    create_request,
    download,
    expect_error,
    file_lock_client,
    put_chunks,
    split,
    wait_status,
)

from services.common.db import create_engine, session_factory
from services.common.outbox.models import outbox_events

CHUNK = 1024


async def _event_types(database_url: str, aggregate_id: str) -> list[str]:
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            rows = await session.execute(
                select(outbox_events.c.event_type)
                .where(outbox_events.c.aggregate_id == aggregate_id)
                .order_by(outbox_events.c.id)
            )
            return list(rows.scalars())
    finally:
        await engine.dispose()


async def _wait_for_waiter(holder: LockClient, key: str) -> None:
    deadline = time.monotonic() + 30
    while not (await holder.describe(key)).waiters:
        assert time.monotonic() < deadline, "the merge never queued for the file lock"
        await asyncio.sleep(0.02)


async def _alice_file_shared_with_bob(cluster) -> tuple[str, bytes, int]:
    alice = cluster["alice"]
    original = os.urandom(CHUNK + 1)
    upload = await alice.uploads.CreateUpload(
        create_request(original, CHUNK), metadata=alice.metadata
    )
    for i, c in enumerate(split(original, CHUNK)):
        await alice.uploads.PutChunk(chunk_request(upload.upload_id, i, c), metadata=alice.metadata)
    done = await wait_status(alice, upload.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    shared = await alice.files.ShareFile(
        upload_pb2.ShareFileRequest(
            file_id=done.file_id, user_id="bob", role=upload_pb2.ROLE_EDITOR
        ),
        metadata=alice.metadata,
    )
    return done.file_id, original, shared.version


async def _merge_parked_on_the_lock(cluster, locks_address, file_id: str, data: bytes):
    """Bob's upload to `file_id`, all chunks sent, its merge waiting for a lock we hold."""
    bob = cluster["bob"]
    upload = await bob.uploads.CreateUpload(
        upload_pb2.CreateUploadRequest(
            file_id=file_id,
            total_chunks=len(split(data, CHUNK)),
            total_size=len(data),
            chunk_size=CHUNK,
        ),
        metadata=bob.metadata,
    )
    key = f"file:{file_id}"
    holder = file_lock_client(locks_address, owner=f"blocker-{uuid.uuid4().hex[:6]}")
    lock = await holder.acquire(key, ttl=60, wait_timeout=5)
    await put_chunks(bob, upload.upload_id, split(data, CHUNK))
    await _wait_for_waiter(holder, key)
    return upload, holder, lock


async def test_unshare_during_the_merge_fails_the_upload_invisibly(
    cluster, locks_address, database_url
) -> None:
    alice, bob = cluster["alice"], cluster["bob"]
    file_id, original, version = await _alice_file_shared_with_bob(cluster)
    upload, holder, lock = await _merge_parked_on_the_lock(
        cluster, locks_address, file_id, os.urandom(CHUNK * 2)
    )
    try:
        unshared = await alice.files.UnshareFile(
            upload_pb2.UnshareFileRequest(file_id=file_id, user_id="bob"), metadata=alice.metadata
        )
    finally:
        await holder.release(f"file:{file_id}", lock.token)
        await holder.close()
    failed = await wait_status(bob, upload.upload_id, upload_pb2.UPLOAD_STATUS_FAILED)
    assert failed.failure_reason.startswith("UPLOADER_NOT_ALLOWED"), failed.failure_reason
    after = await alice.files.GetFile(
        upload_pb2.GetFileRequest(file_id=file_id), metadata=alice.metadata
    )
    assert after.version == unshared.version == version + 1
    assert (await download(alice, file_id))[0] == original
    assert "file.content.updated" not in (await _event_types(database_url, file_id))[1:]
    merged = cluster.settings.blob_root / "files" / file_id / upload.upload_id
    assert not merged.exists()


async def test_delete_during_the_merge_fails_the_upload(cluster, locks_address) -> None:
    alice, bob = cluster["alice"], cluster["bob"]
    file_id, original, _ = await _alice_file_shared_with_bob(cluster)
    upload, holder, lock = await _merge_parked_on_the_lock(
        cluster, locks_address, file_id, os.urandom(CHUNK)
    )
    try:
        deleted = await alice.files.DeleteFile(
            upload_pb2.DeleteFileRequest(file_id=file_id), metadata=alice.metadata
        )
    finally:
        await holder.release(f"file:{file_id}", lock.token)
        await holder.close()
    failed = await wait_status(bob, upload.upload_id, upload_pb2.UPLOAD_STATUS_FAILED)
    assert failed.failure_reason.startswith("FILE_DELETED"), failed.failure_reason
    restored = await alice.files.RestoreFile(
        upload_pb2.RestoreFileRequest(file_id=file_id), metadata=alice.metadata
    )
    assert restored.version == deleted.version + 1
    assert (await download(alice, file_id))[0] == original


async def test_put_chunk_after_unshare_is_refused(cluster) -> None:
    alice, bob = cluster["alice"], cluster["bob"]
    file_id, _, _ = await _alice_file_shared_with_bob(cluster)
    data = os.urandom(CHUNK * 2)
    upload = await bob.uploads.CreateUpload(
        upload_pb2.CreateUploadRequest(
            file_id=file_id, total_chunks=2, total_size=len(data), chunk_size=CHUNK
        ),
        metadata=bob.metadata,
    )
    await bob.uploads.PutChunk(
        chunk_request(upload.upload_id, 0, data[:CHUNK]), metadata=bob.metadata
    )
    await alice.files.UnshareFile(
        upload_pb2.UnshareFileRequest(file_id=file_id, user_id="bob"), metadata=alice.metadata
    )
    last = chunk_request(upload.upload_id, 1, data[CHUNK:])
    await expect_error(
        bob.uploads.PutChunk(last, metadata=bob.metadata),
        grpc.StatusCode.PERMISSION_DENIED,
        "UPLOADER_NOT_ALLOWED",
    )

    async def stream():
        yield last

    await expect_error(
        bob.uploads.UploadChunks(stream(), metadata=bob.metadata),
        grpc.StatusCode.PERMISSION_DENIED,
        "UPLOADER_NOT_ALLOWED",
    )
    still = await bob.uploads.GetUpload(
        upload_pb2.GetUploadRequest(upload_id=upload.upload_id), metadata=bob.metadata
    )
    assert still.status == upload_pb2.UPLOAD_STATUS_UPLOADING


async def test_new_file_in_a_folder_deleted_meanwhile(cluster) -> None:
    alice = cluster["alice"]
    folder = await alice.files.CreateFolder(
        upload_pb2.CreateFolderRequest(name="inbox"), metadata=alice.metadata
    )
    data = os.urandom(CHUNK)
    upload = await alice.uploads.CreateUpload(
        create_request(data, CHUNK, folder_id=folder.file_id), metadata=alice.metadata
    )
    await alice.files.DeleteFile(
        upload_pb2.DeleteFileRequest(file_id=folder.file_id), metadata=alice.metadata
    )
    await expect_error(
        alice.uploads.PutChunk(chunk_request(upload.upload_id, 0, data), metadata=alice.metadata),
        grpc.StatusCode.FAILED_PRECONDITION,
        "FILE_DELETED",
    )
