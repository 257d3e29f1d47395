"""A merge parked on the file lock holds no database transaction: chunk uploads to other
uploads proceed meanwhile (on SQLite a begun transaction would hold the write lock)."""

from __future__ import annotations

import asyncio
import os
import time
import uuid

from serentak.sdk.locks import LockClient
from serentak.upload.v1 import upload_pb2
from upload.upload_helpers import (
    chunk_request,
    create_request,
    download,
    file_lock_client,
    put_chunks,
    split,
    wait_status,
)

CHUNK = 1024
# Longer than the SQLite busy timeout: a put blocked behind the merge would fail, not wait.
PUT_DEADLINE_S = 15.0


async def _wait_for_waiter(holder: LockClient, key: str) -> None:
    """Until the lock service shows someone queued behind our hold on `key`."""
    deadline = time.monotonic() + 30
    while True:
        described = await holder.describe(key)
        if described.waiters:
            return
        assert time.monotonic() < deadline, "the merge never queued for the file lock"
        await asyncio.sleep(0.02)


async def test_chunks_of_other_uploads_are_stored_while_a_merge_waits(
    cluster, locks_address
) -> None:
    alice = cluster["alice"]
    data = os.urandom(CHUNK * 3 + 7)
    other = os.urandom(CHUNK * 4)
    upload = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    second = await alice.uploads.CreateUpload(
        create_request(other, CHUNK, name="other.bin"), metadata=alice.metadata
    )
    key = f"file:{upload.file_id}"
    holder = file_lock_client(locks_address, owner=f"blocker-{uuid.uuid4().hex[:6]}")
    lock = await holder.acquire(key, ttl=60, wait_timeout=5)
    try:
        await put_chunks(alice, upload.upload_id, split(data, CHUNK))
        # The merge ran merge_core and now waits for the lock we hold.
        await _wait_for_waiter(holder, key)
        merged = cluster.settings.blob_root / "files" / upload.file_id / upload.upload_id
        assert merged.exists()
        for i, c in enumerate(split(other, CHUNK)[:3]):
            stored = await alice.uploads.PutChunk(
                chunk_request(second.upload_id, i, c),
                metadata=alice.metadata,
                timeout=PUT_DEADLINE_S,
            )
            assert (stored.chunk_index, stored.duplicate) == (i, False)
        parked = await alice.uploads.GetUpload(
            upload_pb2.GetUploadRequest(upload_id=upload.upload_id), metadata=alice.metadata
        )
        assert parked.status == upload_pb2.UPLOAD_STATUS_MERGING
    finally:
        await holder.release(key, lock.token)
        await holder.close()
    done = await wait_status(alice, upload.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    assert done.file_version == 1
    assert (await download(alice, done.file_id))[0] == data
