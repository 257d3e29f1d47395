"""The upload service's rate limits (services/upload/rate_families.py), on SQLite (in
memory) and PostgreSQL (the shared table): a chunk costs one write whether it comes by
PutChunk or on an UploadChunks stream, and the stream is refused at the message past the
limit; each refusal is RESOURCE_EXHAUSTED / RATE_LIMITED naming family and scope, with a
RetryInfo; families and tenants have windows of their own."""

from __future__ import annotations

import os
from typing import Any

import grpc
import pytest
from serentak.upload.v1 import upload_pb2
from support.grpc_errors import error_info, retry_delay
from upload.upload_helpers import chunk_request, create_request, split

from services.common.metrics import RATE_LIMITED

CHUNK = 1024
RE = grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    return {
        "rate_limit_writes_per_user": 6,
        "rate_limit_writes_per_tenant": 0,
        "rate_limit_sharing_per_user": 2,
        "rate_limit_sharing_per_tenant": 3,
    }


def refused(family: str, scope: str) -> float:
    return RATE_LIMITED.labels("upload", family, scope)._value.get()


def assert_limited(exc: grpc.aio.AioRpcError, family: str, scope: str) -> None:
    assert exc.code() == RE, exc
    info = error_info(exc)
    assert info.reason == "RATE_LIMITED"
    assert (info.metadata["family"], info.metadata["scope"]) == (family, scope)
    assert 0 < retry_delay(exc) <= 60


async def stream(client: Any, upload_id: str, chunks: list[bytes]):
    async def requests():
        for i, data in enumerate(chunks):
            yield chunk_request(upload_id, i, data)

    return await client.uploads.UploadChunks(requests(), metadata=client.metadata)


async def test_stream_messages_count_like_calls(cluster) -> None:
    alice, carol = cluster["alice"], cluster["carol"]
    before = refused("writes", "user")
    data = os.urandom(5 * CHUNK)
    # 1 (CreateUpload) + 5 (the stream's call and its 4 later messages) = the limit, 6.
    created = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    answer = await stream(alice, created.upload_id, split(data, CHUNK))
    assert len(answer.chunks) == 5
    with pytest.raises(grpc.aio.AioRpcError) as limited:
        await alice.uploads.PutChunk(
            chunk_request(created.upload_id, 0, data[:CHUNK]), metadata=alice.metadata
        )
    assert_limited(limited.value, "writes", "user")
    # Reads are another family: alice still reads.
    await alice.uploads.GetUpload(
        upload_pb2.GetUploadRequest(upload_id=created.upload_id), metadata=alice.metadata
    )
    # carol's stream of 8 chunks is refused at its 6th message (1 + 5 units spent).
    data = os.urandom(8 * CHUNK)
    created = await carol.uploads.CreateUpload(create_request(data, CHUNK), metadata=carol.metadata)
    with pytest.raises(grpc.aio.AioRpcError) as limited:
        await stream(carol, created.upload_id, split(data, CHUNK))
    assert_limited(limited.value, "writes", "user")
    assert refused("writes", "user") == before + 2


async def test_a_tenant_shares_one_window_and_other_tenants_have_theirs(cluster) -> None:
    alice, bob, mallory = cluster["alice"], cluster["bob"], cluster["mallory"]

    async def share(client: Any) -> str:
        # An unknown file: NOT_FOUND, once the call was admitted (and counted).
        request = upload_pb2.ShareFileRequest(
            file_id="no-such-file", user_id="x", role=upload_pb2.ROLE_VIEWER
        )
        try:
            await client.files.ShareFile(request, metadata=client.metadata)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == RE:
                assert_limited(exc, "sharing", error_info(exc).metadata["scope"])
                return error_info(exc).metadata["scope"]
            return exc.code().name
        return "OK"

    assert [await share(alice) for _ in range(3)] == ["NOT_FOUND", "NOT_FOUND", "user"]
    # acme has spent 2 of its 3: bob gets one, then his tenant's window is full.
    assert [await share(bob) for _ in range(2)] == ["NOT_FOUND", "tenant"]
    assert [await share(mallory) for _ in range(3)] == ["NOT_FOUND", "NOT_FOUND", "user"]
