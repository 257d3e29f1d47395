"""The seeds' upload metrics, each moved by the thing it counts: uploads missing chunks
(gauge), time in `uploading` and `merging` (histogram), merge failures for the lock
(reason="lock"), chunk conflicts by index bucket."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY
from serentak.upload.v1 import upload_pb2
from upload.upload_helpers import chunk_request, create_request, split, wait_status

from services.common.db import create_engine, session_factory
from services.locks.client import LockClient
from services.upload.metrics import index_bucket
from services.upload.status_ages import refresh_status_ages

CHUNK = 1024


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    # A merge gives up waiting for a held file lock quickly (and retries).
    return {"merge_lock_wait_ms": 200, "merge_retry_base_seconds": 0.05}


def _value(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_index_buckets() -> None:
    assert [index_bucket(i) for i in (0, 1, 9, 10, 99, 100, 999, 1000, 10**6)] == [
        "0",
        "1-9",
        "1-9",
        "10-99",
        "10-99",
        "100-999",
        "100-999",
        "1000+",
        "1000+",
    ]


async def test_seed_metrics_move(cluster, locks_address) -> None:
    alice = cluster["alice"]
    md = alice.metadata
    uploading = _value("serentak_upload_status_seconds_count", {"status": "uploading"})
    merging = _value("serentak_upload_status_seconds_count", {"status": "merging"})
    lock_failures = _value("serentak_upload_merge_failures_total", {"reason": "lock"})
    conflicts = _value("serentak_upload_chunk_conflicts_by_index_total", {"bucket": "1-9"})

    # An upload missing a chunk: the gauge counts it.
    data = os.urandom(CHUNK * 3)
    partial = await alice.uploads.CreateUpload(
        create_request(data, CHUNK, name="p.bin"), metadata=md
    )
    await alice.uploads.PutChunk(
        chunk_request(partial.upload_id, 1, split(data, CHUNK)[1]), metadata=md
    )
    engine = create_engine(cluster.settings.database_url)
    try:
        await refresh_status_ages(session_factory(engine))
        assert _value("serentak_upload_uploads_missing_chunks") == 1
    finally:
        await engine.dispose()

    # A conflict at index 1.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await alice.uploads.PutChunk(chunk_request(partial.upload_id, 1, b"z" * CHUNK), metadata=md)
    assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert (
        _value("serentak_upload_chunk_conflicts_by_index_total", {"bucket": "1-9"}) - conflicts == 1
    )

    # A merge that waits for a held file lock fails that attempt for the lock, then, with the
    # lock released, completes: both status times observed.
    holder = LockClient(locks_address, owner=f"blocker-{uuid.uuid4().hex[:6]}", token="dev-alice")
    up = await alice.uploads.CreateUpload(create_request(data, CHUNK, name="m.bin"), metadata=md)
    lock = await holder.acquire(f"file:{up.file_id}", ttl=30, wait_timeout=5)
    try:
        for i, c in enumerate(split(data, CHUNK)):
            await alice.uploads.PutChunk(chunk_request(up.upload_id, i, c), metadata=md)
        end = time.monotonic() + 30
        while _value("serentak_upload_merge_failures_total", {"reason": "lock"}) == lock_failures:
            assert time.monotonic() < end, "the merge never failed on the lock"
            await asyncio.sleep(0.05)
    finally:
        await holder.release(f"file:{up.file_id}", lock.token)
        await holder.close()
    await wait_status(alice, up.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    assert _value("serentak_upload_status_seconds_count", {"status": "uploading"}) - uploading == 1
    assert _value("serentak_upload_status_seconds_count", {"status": "merging"}) - merging == 1
