"""Invariants 1 and 2: one row per (upload_id, chunk_index); conflicts leave the stored
chunk untouched; received_chunk_count equals the distinct stored indexes — under races."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
from datetime import timedelta

import grpc
import pytest
from serentak.upload.v1 import upload_pb2
from sqlalchemy import func, select
from upload.upload_helpers import chunk_request, create_request, expect_error, split

from services.common.db import create_engine, session_factory
from services.upload.models import ChunkRow, UploadRow
from services.upload.storage.blob_store import chunk_key, upload_prefix

CHUNK = 1024


@pytest.mark.parametrize("blob_backend", ["local", "s3"])
async def test_conflicting_chunk_is_refused_and_the_original_stays(cluster) -> None:
    alice = cluster["alice"]
    data = os.urandom(CHUNK * 3)
    upload = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    original = data[:CHUNK]
    await alice.uploads.PutChunk(
        chunk_request(upload.upload_id, 0, original), metadata=alice.metadata
    )
    other = os.urandom(CHUNK)
    await expect_error(
        alice.uploads.PutChunk(chunk_request(upload.upload_id, 0, other), metadata=alice.metadata),
        grpc.StatusCode.ALREADY_EXISTS,
        "CHUNK_CONFLICT",
    )
    assert await cluster.blobs.read(chunk_key(upload.upload_id, 0)) == original
    again = await alice.uploads.PutChunk(
        chunk_request(upload.upload_id, 0, original), metadata=alice.metadata
    )
    assert again.duplicate and again.received_chunk_count == 1


@pytest.mark.parametrize("blob_backend", ["local", "s3"])
async def test_bad_checksum_stores_nothing(cluster) -> None:
    alice = cluster["alice"]
    data = os.urandom(CHUNK * 2)
    upload = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    bad = upload_pb2.PutChunkRequest(
        upload_id=upload.upload_id, chunk_index=1, data=data[CHUNK:], checksum="0" * 64
    )
    info = await expect_error(
        alice.uploads.PutChunk(bad, metadata=alice.metadata),
        grpc.StatusCode.INVALID_ARGUMENT,
        "CHECKSUM_MISMATCH",
    )
    # The answer names both digests (the bytes were hashed while being staged).
    assert info.metadata["expected"] == "0" * 64
    assert info.metadata["actual"] == hashlib.sha256(data[CHUNK:]).hexdigest()
    got = await alice.uploads.GetUpload(
        upload_pb2.GetUploadRequest(upload_id=upload.upload_id), metadata=alice.metadata
    )
    assert got.received_chunk_count == 0
    assert not await cluster.blobs.exists(chunk_key(upload.upload_id, 1))
    # Not even a staged temp file is left behind.
    assert not [o async for o in cluster.blobs.list_objects(upload_prefix(upload.upload_id))]


@pytest.mark.parametrize("blob_backend", ["local", "s3"])
async def test_racing_first_stores_of_one_index_have_one_winner(cluster) -> None:
    """Many senders race different bytes for the same index: one wins, its bytes stay."""
    alice = cluster["alice"]
    for _round in range(5):
        data = os.urandom(CHUNK * 2)
        upload = await alice.uploads.CreateUpload(
            create_request(data, CHUNK), metadata=alice.metadata
        )
        candidates = [os.urandom(CHUNK) for _ in range(4)]
        sends = [random.choice(candidates) for _ in range(12)]

        async def send(payload: bytes, upload_id: str = upload.upload_id) -> tuple[str, bytes]:
            try:
                r = await alice.uploads.PutChunk(
                    chunk_request(upload_id, 0, payload), metadata=alice.metadata
                )
                return ("dup" if r.duplicate else "new", payload)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.ALREADY_EXISTS, exc.details()
                return ("conflict", payload)

        results = await asyncio.gather(*(send(p) for p in sends))
        winners = [p for kind, p in results if kind == "new"]
        assert len(winners) == 1
        # Everyone who sent the winner's bytes succeeded; everyone else was refused.
        for kind, payload in results:
            assert (kind != "conflict") == (payload == winners[0])
        assert await cluster.blobs.read(chunk_key(upload.upload_id, 0)) == winners[0]
        got = await alice.uploads.GetUpload(
            upload_pb2.GetUploadRequest(upload_id=upload.upload_id), metadata=alice.metadata
        )
        assert got.received_chunk_count == 1


async def test_received_count_equals_distinct_rows_under_retries(cluster) -> None:
    """Shuffled chunks, each sent 1-3 times concurrently, never complete the set here."""
    alice = cluster["alice"]
    data = os.urandom(CHUNK * 20)
    upload = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    chunks = split(data, CHUNK)
    # Leave index 7 out so the upload stays uploading and the count is observable.
    plan = [i for i in range(20) if i != 7 for _ in range(random.randint(1, 3))]
    random.shuffle(plan)
    await asyncio.gather(
        *(
            alice.uploads.PutChunk(
                chunk_request(upload.upload_id, i, chunks[i]), metadata=alice.metadata
            )
            for i in plan
        )
    )
    engine = create_engine(cluster.settings.database_url)
    try:
        async with session_factory(engine)() as session:
            rows = (
                await session.execute(
                    select(ChunkRow.chunk_index, func.count())
                    .where(ChunkRow.upload_id == upload.upload_id)
                    .group_by(ChunkRow.chunk_index)
                )
            ).all()
            count = (await session.get(UploadRow, upload.upload_id)).received_chunk_count
    finally:
        await engine.dispose()
    assert all(n == 1 for _, n in rows)
    assert sorted(i for i, _ in rows) == [i for i in range(20) if i != 7]
    assert count == 19


@pytest.mark.parametrize("blob_backend", ["local", "s3"])
async def test_an_upload_that_cannot_take_chunks_answers_as_before_and_stages_nothing(
    cluster,
) -> None:
    """Past its expiry, or aborted: a wrong checksum is still CHECKSUM_MISMATCH (the bytes
    are checked first), a right one UPLOAD_EXPIRED / UPLOAD_NOT_ACTIVE; no bytes are kept."""
    alice = cluster["alice"]
    data = os.urandom(CHUNK * 2)
    expired = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    aborted = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    await alice.uploads.AbortUpload(
        upload_pb2.AbortUploadRequest(upload_id=aborted.upload_id), metadata=alice.metadata
    )
    engine = create_engine(cluster.settings.database_url)
    try:
        async with session_factory(engine).begin() as session:
            row = await session.get(UploadRow, expired.upload_id)
            row.expires_at = row.created_at - timedelta(seconds=1)
    finally:
        await engine.dispose()
    for upload_id, reason in (
        (expired.upload_id, "UPLOAD_EXPIRED"),
        (aborted.upload_id, "UPLOAD_NOT_ACTIVE"),
    ):
        wrong = upload_pb2.PutChunkRequest(
            upload_id=upload_id, chunk_index=0, data=data[:CHUNK], checksum="0" * 64
        )
        await expect_error(
            alice.uploads.PutChunk(wrong, metadata=alice.metadata),
            grpc.StatusCode.INVALID_ARGUMENT,
            "CHECKSUM_MISMATCH",
        )
        await expect_error(
            alice.uploads.PutChunk(
                chunk_request(upload_id, 0, data[:CHUNK]), metadata=alice.metadata
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            reason,
        )
        assert not [o async for o in cluster.blobs.list_objects(upload_prefix(upload_id))]
