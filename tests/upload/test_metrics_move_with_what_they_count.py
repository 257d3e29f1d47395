"""The seeds' upload metrics, each moved by the thing it counts: uploads missing chunks
(gauge), time in `uploading` and `merging` (histogram), merge failures by reason (lock,
missing_chunk, size; checksum: test_merge_failures.py), chunk conflicts by index bucket,
the age of the oldest unpublished outbox event. Lock wait and contention by key pattern:
tests/locks/test_lock_metrics.py."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import uuid
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY
from serentak.upload.v1 import upload_pb2
from sqlalchemy import delete
from upload.upload_helpers import (
    chunk_request,
    create_request,
    file_lock_client,
    split,
    wait_status,
)

from services.common.db import create_engine, session_factory
from services.common.jobs import RuntimeOptions
from services.upload.ingest.status_ages import refresh_status_ages
from services.upload.metrics import index_bucket
from services.upload.models import ChunkRow
from services.upload.storage.blob_store import chunk_key

CHUNK = 1024


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    # A merge gives up waiting for a held file lock quickly (and retries).
    return {"merge_lock_wait_ms": 200, "merge_retry_base_seconds": 0.05}


@pytest.fixture
def runtime_options(runtime_options: RuntimeOptions) -> RuntimeOptions:
    # The queue gauges (outbox age among them) re-read often enough to watch them move.
    return dataclasses.replace(runtime_options, stats_interval=0.2)


async def _until(condition, what: str, within: float = 30) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + within
    while not condition():
        assert time.monotonic() < end, what
        await asyncio.sleep(0.05)


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


async def test_each_upload_metric_moves_with_what_it_counts(cluster, locks_address) -> None:
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
    holder = file_lock_client(locks_address, owner=f"blocker-{uuid.uuid4().hex[:6]}")
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


@pytest.mark.parametrize(
    ("reason", "damage"),
    [
        # An index has no chunk row (the merge finds the set is not 0..n-1).
        ("missing_chunk", None),
        # The chunk's blob is shorter than its row says (merge_core: ChunkSizeMismatch).
        ("size", b"short"),
    ],
)
async def test_merge_failures_by_reason(cluster, reason: str, damage: bytes | None) -> None:
    alice = cluster["alice"]
    before = _value("serentak_upload_merge_failures_total", {"reason": reason})
    data = os.urandom(CHUNK * 3)
    chunks = split(data, CHUNK)
    up = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    for i in (0, 1):
        await alice.uploads.PutChunk(
            chunk_request(up.upload_id, i, chunks[i]), metadata=alice.metadata
        )
    key = chunk_key(up.upload_id, 1)
    if damage is None:
        engine = create_engine(cluster.settings.database_url)
        try:
            async with session_factory(engine).begin() as session:
                await session.execute(
                    delete(ChunkRow).where(
                        ChunkRow.upload_id == up.upload_id, ChunkRow.chunk_index == 1
                    )
                )
        finally:
            await engine.dispose()
    else:
        await cluster.blobs.publish(await cluster.blobs.stage(key, damage), key)
    await alice.uploads.PutChunk(chunk_request(up.upload_id, 2, chunks[2]), metadata=alice.metadata)
    failed = await wait_status(
        alice, up.upload_id, upload_pb2.UPLOAD_STATUS_FAILED, upload_pb2.UPLOAD_STATUS_COMPLETED
    )
    assert failed.status == upload_pb2.UPLOAD_STATUS_FAILED
    assert _value("serentak_upload_merge_failures_total", {"reason": reason}) - before == 1


async def test_oldest_unpublished_outbox_event_age(cluster) -> None:
    """No notify here (publish_events off): a committed upload's event stays unpublished,
    and the gauge reports its age, growing."""
    gauge = "serentak_outbox_oldest_unpublished_age_seconds"
    await _until(lambda: _value(gauge) == 0, "a fresh outbox reports age 0")
    alice = cluster["alice"]
    data = os.urandom(CHUNK)
    up = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    await alice.uploads.PutChunk(chunk_request(up.upload_id, 0, data), metadata=alice.metadata)
    await wait_status(alice, up.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    await _until(lambda: _value(gauge) > 0, "the unpublished event's age never showed")
    first = _value(gauge)
    await _until(lambda: _value(gauge) > first, "the age did not grow")
    assert _value("serentak_outbox_unpublished_events") >= 1
