"""Expiry and cleanup (the `upload.expire` periodic job): idle uploads become `expired`
(only from uploading); chunks of expired and aborted uploads are deleted, never those of
a merging upload, however old; completed uploads' files are untouched."""

from __future__ import annotations

import os
import uuid
from datetime import timedelta
from typing import Any

import pytest
from serentak.upload.v1 import upload_pb2
from upload.upload_helpers import (
    chunk_row_count,
    create_request,
    download,
    file_lock_client,
    put_chunks,
    split,
    wait_chunks_purged,
    wait_status,
)

from services.common.db import create_engine, session_factory
from services.upload.ingest.expiry import expire_and_clean
from services.upload.models import UploadRow, utcnow
from services.upload.storage.blob_store import chunk_key

CHUNK = 1024


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    # A short TTL and sweep period so the running service's own job can be watched too.
    return {"upload_ttl_seconds": 3.0, "expiry_interval_seconds": 0.5}


async def _start(client, data: bytes, name: str) -> upload_pb2.Upload:
    return await client.uploads.CreateUpload(
        create_request(data, CHUNK, name=name), metadata=client.metadata
    )


@pytest.mark.parametrize("blob_backend", ["local", "s3"])
async def test_cleanup_spares_merging_and_completed_uploads(cluster, locks_address) -> None:
    alice = cluster["alice"]
    data = {name: os.urandom(CHUNK * 2 + 5) for name in ("idle", "merging", "aborted", "done")}
    chunks = {name: split(d, CHUNK) for name, d in data.items()}
    # Each upload is created just before its chunks: the service's own sweep (TTL 3 s)
    # must not expire one before the test has put it in the state it needs.
    ups = {"done": await _start(alice, data["done"], "done.bin")}
    await put_chunks(alice, ups["done"].upload_id, chunks["done"], range(3))
    done = await wait_status(alice, ups["done"].upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    ups["idle"] = await _start(alice, data["idle"], "idle.bin")
    await put_chunks(alice, ups["idle"].upload_id, chunks["idle"], [0, 1])
    ups["aborted"] = await _start(alice, data["aborted"], "aborted.bin")
    await put_chunks(alice, ups["aborted"].upload_id, chunks["aborted"], [0])
    await alice.uploads.AbortUpload(
        upload_pb2.AbortUploadRequest(upload_id=ups["aborted"].upload_id),
        metadata=alice.metadata,
    )
    # Park a merge on the file lock: the upload stays `merging` with all its chunks.
    holder = file_lock_client(locks_address, owner=f"blocker-{uuid.uuid4().hex[:6]}")
    ups["merging"] = await _start(alice, data["merging"], "merging.bin")
    key = f"file:{ups['merging'].file_id}"
    lock = await holder.acquire(key, ttl=60, wait_timeout=5)
    engine = create_engine(cluster.settings.database_url)
    sessions = session_factory(engine)
    try:
        await put_chunks(alice, ups["merging"].upload_id, chunks["merging"], range(3))
        # Far past every TTL: whatever is old enough goes, whatever may not go stays.
        result = await expire_and_clean(
            sessions, cluster.blobs, 3600, now=utcnow() + timedelta(days=2)
        )
        assert result.chunk_rows_deleted <= 3  # idle (2) and aborted (1), or fewer if the
        # service's own sweep got there first; never more.
        async with sessions() as session:
            status = {
                name: (await session.get(UploadRow, up.upload_id)).status
                for name, up in ups.items()
            }
        assert status == {
            "idle": "expired",
            "merging": "merging",
            "aborted": "aborted",
            "done": "completed",
        }
        for name in ("idle", "aborted"):
            assert await chunk_row_count(sessions, ups[name].upload_id) == 0
            for i in range(3):
                assert not await cluster.blobs.exists(chunk_key(ups[name].upload_id, i))
        # The expiry sweep never takes a merging upload's chunks (a completed upload's go
        # by its own purge job: tests/upload/storage/test_storage_lifecycle.py).
        assert await chunk_row_count(sessions, ups["merging"].upload_id) == 3
        for i in range(3):
            assert await cluster.blobs.exists(chunk_key(ups["merging"].upload_id, i))
    finally:
        await holder.release(key, lock.token)
        await holder.close()
    try:
        # The spared merge finishes from its intact chunks.
        merged = await wait_status(
            alice, ups["merging"].upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED
        )
        assert (await download(alice, merged.file_id))[0] == data["merging"]
        assert (await download(alice, done.file_id))[0] == data["done"]
    finally:
        await engine.dispose()


async def test_the_service_sweep_expires_idle_uploads_and_deletes_their_chunks(cluster) -> None:
    alice = cluster["alice"]
    data = os.urandom(CHUNK * 3)
    upload = await _start(alice, data, "idle.bin")
    await put_chunks(alice, upload.upload_id, split(data, CHUNK), [0, 1])
    folder = cluster.settings.blob_root / "uploads" / upload.upload_id
    assert folder.exists()
    engine = create_engine(cluster.settings.database_url)
    try:
        sessions = session_factory(engine)
        # A test about time: the TTL is 3 s and the sweep runs every 0.5 s. The sweep
        # deletes the blobs first and then, in its own transaction, the rows and sets
        # chunks_purged_at: wait for that last step, then check the blobs went before it.
        row = await wait_chunks_purged(sessions, upload.upload_id, "the expiry sweep")
        assert row.status == "expired"
        assert not folder.exists()
        assert await chunk_row_count(sessions, upload.upload_id) == 0
    finally:
        await engine.dispose()
