"""An object store that is down answers UNAVAILABLE with BLOB_STORE_UNAVAILABLE (never
INTERNAL), records nothing, and the same chunk succeeds once the store is back."""

from __future__ import annotations

import os
from typing import Any

import grpc
import pytest
from serentak.upload.v1 import upload_pb2
from support.grpc_errors import error_info
from upload.upload_helpers import (
    chunk_request,
    create_request,
    sha256,
    split,
    wait_status,
)

from services.upload.storage.blob_store import chunk_key, content_key

CHUNK = 1024


@pytest.fixture
def private_s3(s3_factory: Any) -> Any:
    """An S3 server of this test's own (it is stopped and restarted)."""
    return s3_factory()


@pytest.fixture
def settings_overrides(private_s3: Any) -> dict[str, Any]:
    return private_s3.upload_settings()


async def test_a_chunk_put_while_the_store_is_down_is_unavailable(cluster, private_s3) -> None:
    alice = cluster["alice"]
    data = os.urandom(CHUNK * 2)
    chunks = split(data, CHUNK)
    upload = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    await alice.uploads.PutChunk(
        chunk_request(upload.upload_id, 0, chunks[0]), metadata=alice.metadata
    )
    private_s3.stop()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await alice.uploads.PutChunk(
            chunk_request(upload.upload_id, 1, chunks[1]), metadata=alice.metadata
        )
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_info(caught.value).reason == "BLOB_STORE_UNAVAILABLE"
    # The caller learns to retry, not where the store is or what it answered.
    details = caught.value.details() or ""
    assert "retry" in details
    assert private_s3.endpoint not in details and "127.0.0.1" not in details
    got = await alice.uploads.GetUpload(
        upload_pb2.GetUploadRequest(upload_id=upload.upload_id), metadata=alice.metadata
    )
    # The failed PUT rolled back its row: index 1 is still missing, nothing was counted.
    assert got.received_chunk_count == 1
    assert [(r.start, r.end) for r in got.missing_ranges] == [(1, 2)]
    private_s3.start()
    assert not await cluster.blobs.exists(chunk_key(upload.upload_id, 1))
    retried = await alice.uploads.PutChunk(
        chunk_request(upload.upload_id, 1, chunks[1]), metadata=alice.metadata
    )
    assert not retried.duplicate
    done = await wait_status(alice, upload.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    assert done.final_checksum == sha256(data)
    assert await cluster.blobs.read(content_key(done.file_id, done.upload_id)) == data
