"""`serentak_upload_chunk_index_conflict_repeats_total`: conflicts fought over one chunk
index (the seed's "same index" spike; SerentakChunkIndexConflictRepeated) count from the
second conflict on a pair; one-off conflicts on different indexes do not."""

from __future__ import annotations

import os

import grpc
import pytest
from prometheus_client import REGISTRY
from upload.upload_helpers import chunk_request, create_request

from services.upload.ingest.conflict_repeats import ConflictRepeats

CHUNK = 1024
METRIC = "serentak_upload_chunk_index_conflict_repeats_total"


def _repeats() -> float:
    return REGISTRY.get_sample_value(METRIC) or 0.0


def test_counts_from_the_second_conflict_on_a_pair_and_forgets_the_oldest() -> None:
    repeats = ConflictRepeats(capacity=2)
    before = _repeats()
    assert repeats.record("u1", 0) == 1
    assert repeats.record("u1", 1) == 1
    assert _repeats() == before
    assert repeats.record("u1", 0) == 2
    assert _repeats() == before + 1
    assert repeats.record("u2", 0) == 1  # evicts ("u1", 1), the least recently seen
    assert repeats.record("u1", 1) == 1
    assert repeats.record("u1", 0) == 1  # evicted in turn by ("u1", 1)
    assert _repeats() == before + 1


async def test_one_index_fought_over_counts_repeats(cluster) -> None:
    alice = cluster["alice"]
    data = os.urandom(CHUNK * 3)
    upload = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    for index in (0, 1):
        await alice.uploads.PutChunk(
            chunk_request(upload.upload_id, index, data[index * CHUNK : (index + 1) * CHUNK]),
            metadata=alice.metadata,
        )
    before = _repeats()

    async def conflict(index: int) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await alice.uploads.PutChunk(
                chunk_request(upload.upload_id, index, os.urandom(CHUNK)), metadata=alice.metadata
            )
        assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS

    await conflict(1)  # a one-off on index 1
    assert _repeats() == before
    for _ in range(3):  # index 0 fought over three times
        await conflict(0)
    assert _repeats() == before + 2
