"""A corrupt chunk ends the upload `failed` (not stuck in merging, no final object);
a stale lock holder's commit is refused by the fencing check (invariant 7)."""

from __future__ import annotations

import os
import uuid

import pytest
from prometheus_client import REGISTRY
from serentak.upload.v1 import upload_pb2
from upload.upload_helpers import (
    chunk_request,
    create_request,
    file_lock_client,
    put_chunks,
    split,
    wait_status,
)

from services.common.db import create_engine, session_factory
from services.upload.errors import StaleFencingToken
from services.upload.files.versions import commit_fenced
from services.upload.models import FileRow
from services.upload.storage.blob_store import chunk_key, content_key

CHUNK = 1024


@pytest.mark.parametrize("blob_backend", ["local", "s3"])
async def test_corrupt_chunk_fails_the_upload_with_the_reason(cluster) -> None:
    alice = cluster["alice"]
    data = os.urandom(CHUNK * 3)
    chunks = split(data, CHUNK)
    upload = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    await put_chunks(alice, upload.upload_id, chunks, (0, 1))
    checksum_failures = REGISTRY.get_sample_value(
        "serentak_upload_merge_failures_total", {"reason": "checksum"}
    )
    # Bit rot in the store after the chunk was accepted.
    key = chunk_key(upload.upload_id, 1)
    await cluster.blobs.publish(
        await cluster.blobs.stage(key, bytes([chunks[1][0] ^ 0xFF]) + chunks[1][1:]), key
    )
    await alice.uploads.PutChunk(
        chunk_request(upload.upload_id, 2, chunks[2]), metadata=alice.metadata
    )
    failed = await wait_status(
        alice, upload.upload_id, upload_pb2.UPLOAD_STATUS_FAILED, upload_pb2.UPLOAD_STATUS_COMPLETED
    )
    assert failed.status == upload_pb2.UPLOAD_STATUS_FAILED
    assert "ChunkChecksumMismatch" in failed.failure_reason
    # What SerentakMergeFailedMissingOrCorrupt (deploy/prometheus/alerts.yml) watches.
    assert (
        REGISTRY.get_sample_value("serentak_upload_merge_failures_total", {"reason": "checksum"})
        == (checksum_failures or 0) + 1
    )
    assert failed.file_version == 0
    assert not await cluster.blobs.exists(content_key(upload.file_id, upload.upload_id))


@pytest.fixture
async def lock_client(locks_address: str):
    client = file_lock_client(locks_address, owner=f"test-{uuid.uuid4().hex[:6]}")
    yield client
    await client.close()


async def test_stale_lock_holders_commit_is_refused(cluster, lock_client) -> None:
    alice = cluster["alice"]
    upload = await alice.uploads.CreateUpload(create_request(b"v1", CHUNK), metadata=alice.metadata)
    await alice.uploads.PutChunk(chunk_request(upload.upload_id, 0, b"v1"), metadata=alice.metadata)
    done = await wait_status(alice, upload.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    key = f"file:{done.file_id}"
    # The stale holder took the lock first, then lost it (released here; a pause past the
    # TTL does the same); the new holder gets a strictly higher token.
    stale = await lock_client.acquire(key, ttl=10, wait_timeout=5)
    await lock_client.release(key, stale.token)
    fresh = await lock_client.acquire(key, ttl=10, wait_timeout=5)
    assert fresh.token > stale.token
    engine = create_engine(cluster.settings.database_url)
    sessions = session_factory(engine)
    try:
        async with sessions.begin() as session:
            row = await commit_fenced(session, done.file_id, fresh.token, size=111)
            assert row.version == 2
        with pytest.raises(StaleFencingToken):
            async with sessions.begin() as session:
                await commit_fenced(session, done.file_id, stale.token, size=999)
        async with sessions() as session:
            row = await session.get(FileRow, done.file_id)
            assert (row.size, row.version, row.last_lock_token) == (111, 2, fresh.token)
    finally:
        await lock_client.release(key, fresh.token)
        await engine.dispose()
