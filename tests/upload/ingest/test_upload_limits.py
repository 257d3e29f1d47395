"""Upload limits (issue 11, item 8): upload size, per-tenant quota (stored bytes of current
versions + open uploads), per-user open uploads, per-caller rate limit with RetryInfo
(the limiter itself: tests/common/rate_limits/).
Every refusal is RESOURCE_EXHAUSTED with its ErrorInfo reason; SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from serentak.upload.v1 import upload_pb2
from upload.upload_helpers import create_request, error_info, expect_error, upload_completed

CHUNK = 1024
RE = grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    return {
        "max_upload_bytes": 8 * CHUNK,
        "tenant_quota_bytes": 10 * CHUNK,
        "max_open_uploads_per_user": 3,
        "rate_limit_reads_per_user": 12,
        # One window of a day: 13 reads straddling a minute's turn would be two windows'.
        "rate_limit_window_seconds": 86_400,
    }


def _create(client, size: int, name: str = "f.bin"):
    return client.uploads.CreateUpload(
        create_request(b"x" * size, CHUNK, name=name), metadata=client.metadata
    )


async def _abort(client, upload_id: str) -> None:
    await client.uploads.AbortUpload(
        upload_pb2.AbortUploadRequest(upload_id=upload_id), metadata=client.metadata
    )


async def test_an_upload_larger_than_the_limit_is_refused(cluster) -> None:
    alice = cluster["alice"]
    info = await expect_error(_create(alice, 8 * CHUNK + 1), RE, "UPLOAD_TOO_LARGE")
    assert info.metadata["limit"] == str(8 * CHUNK)
    # The 10,000 x 32 MiB request: refused before anything is stored.
    huge = upload_pb2.CreateUploadRequest(
        new_file=upload_pb2.NewFileTarget(name="huge"),
        total_chunks=10_000,
        total_size=10_000 * 32 * 1024 * 1024,
        chunk_size=32 * 1024 * 1024,
    )
    await expect_error(
        alice.uploads.CreateUpload(huge, metadata=alice.metadata), RE, "UPLOAD_TOO_LARGE"
    )
    await _create(alice, 8 * CHUNK)  # at the limit: fine


async def test_quota_counts_stored_versions_and_open_uploads_per_tenant(cluster) -> None:
    alice, mallory = cluster["alice"], cluster["mallory"]
    data = os.urandom(6 * CHUNK)
    await upload_completed(alice, data, CHUNK)
    # 6 stored + 3 open = 9 of 10.
    open_one = await _create(alice, 3 * CHUNK, "open")
    info = await expect_error(_create(cluster["bob"], 2 * CHUNK), RE, "QUOTA_EXCEEDED")
    assert info.metadata["used"] == str(9 * CHUNK)
    # Another tenant has its own quota.
    await _create(mallory, 8 * CHUNK)
    # Aborting frees the open upload's share.
    await _abort(alice, open_one.upload_id)
    await _create(cluster["bob"], 4 * CHUNK)


async def test_concurrent_creates_never_exceed_the_quota(cluster) -> None:
    users = {u: cluster[u] for u in ("alice", "bob", "carol")}
    for round_ in range(3):
        # Nine creates of 3 KiB race for 10 KiB: exactly three may win, on either database.
        racers = [(u, f"r{round_}-{i}") for u in users for i in range(3)]
        results = await asyncio.gather(
            *(_create(users[u], 3 * CHUNK, name) for u, name in racers),
            return_exceptions=True,
        )
        won = [
            (u, r)
            for (u, _), r in zip(racers, results, strict=True)
            if isinstance(r, upload_pb2.Upload)
        ]
        refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
        assert len(won) + len(refused) == 9, results
        assert len(won) == 3, f"round {round_}: {len(won)} creates won 3 KiB of a 10 KiB quota"
        assert all(exc.code() == RE for exc in refused), refused
        for user, upload in won:
            await _abort(users[user], upload.upload_id)


async def test_open_uploads_per_user_are_capped(cluster) -> None:
    bob = cluster["bob"]
    created = [await _create(bob, CHUNK, f"u{i}") for i in range(3)]
    await expect_error(_create(bob, CHUNK, "one too many"), RE, "TOO_MANY_UPLOADS")
    # Others in the tenant are not held back by bob's cap.
    await _create(cluster["carol"], CHUNK)
    await _abort(bob, created[0].upload_id)
    await _create(bob, CHUNK, "room again")


async def test_rate_limit_per_caller_with_retry_info(cluster) -> None:
    carol, alice = cluster["carol"], cluster["alice"]
    request = upload_pb2.ListUploadsRequest()
    for _ in range(12):
        await carol.uploads.ListUploads(request, metadata=carol.metadata)
    with pytest.raises(grpc.aio.AioRpcError) as limited:
        await carol.uploads.ListUploads(request, metadata=carol.metadata)
    assert limited.value.code() == RE
    status = rpc_status.from_call(limited.value)  # type: ignore[arg-type]
    assert status is not None
    reasons, delays = [], []
    for detail in status.details:
        info, retry = error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo()
        if detail.Unpack(info):
            reasons.append(info.reason)
        elif detail.Unpack(retry):
            delays.append(retry.retry_delay.ToTimedelta().total_seconds())
    assert reasons == ["RATE_LIMITED"]
    assert len(delays) == 1 and 0 < delays[0] <= 86_400, delays
    # Per caller and family: alice is not limited by carol's reads, nor carol's writes.
    await alice.uploads.ListUploads(request, metadata=alice.metadata)
    await _create(carol, CHUNK)
    # The anonymous caller bounces off authentication before the limiter.
    await expect_error(
        carol.uploads.ListUploads(request), grpc.StatusCode.UNAUTHENTICATED, "MISSING_CREDENTIALS"
    )


def _small_file(client, size: int, *, name: str = "", file_id: str = ""):
    """One UploadFile of `size` random bytes: a new file `name`, or a version of `file_id`."""
    request = upload_pb2.UploadFileRequest(data=os.urandom(size))
    if file_id:
        request.file_id = file_id
    else:
        request.new_file.name = name
    return client.uploads.UploadFile(request, metadata=client.metadata)


def _three_stored_six_refused(results: list[Any], what: str) -> None:
    """Of nine racing 3 KiB uploads into a 10 KiB quota, exactly three were stored and the
    other six refused QUOTA_EXCEEDED."""
    won = [r for r in results if isinstance(r, upload_pb2.UploadFileResponse)]
    refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(won) + len(refused) == 9, results
    assert len(won) == 3, f"{len(won)} {what} of 3 KiB stored in a 10 KiB quota"
    assert {(exc.code(), error_info(exc).reason) for exc in refused} == {(RE, "QUOTA_EXCEEDED")}


async def test_concurrent_small_files_never_exceed_the_quota(cluster) -> None:
    # Nine small files of 3 KiB race for 10 KiB: the ones committed together in one group
    # commit must count each other's bytes, which are written only at the group's end.
    users = {u: cluster[u] for u in ("alice", "bob", "carol")}
    racers = [(u, f"small-{i}") for u in users for i in range(3)]
    results = await asyncio.gather(
        *(_small_file(users[u], 3 * CHUNK, name=name) for u, name in racers),
        return_exceptions=True,
    )
    _three_stored_six_refused(results, "small files")
    # What was stored is what the quota now counts.
    info = await expect_error(
        _small_file(users["alice"], 2 * CHUNK, name="one more"), RE, "QUOTA_EXCEEDED"
    )
    assert info.metadata["used"] == str(9 * CHUNK)


async def test_small_files_and_creates_racing_never_exceed_the_quota(cluster) -> None:
    # Small files (one transaction each, under the tenant's tree lock, in group commits)
    # and creates (their own transaction) take one allowance lock: they count each other.
    users = {u: cluster[u] for u in ("alice", "bob", "carol")}
    racers = [(u, f"mixed-{i}", i % 2 == 0) for u in users for i in range(3)]
    results = await asyncio.gather(
        *(
            _small_file(users[u], 3 * CHUNK, name=name)
            if small
            else _create(users[u], 3 * CHUNK, name)
            for u, name, small in racers
        ),
        return_exceptions=True,
    )
    won = [r for r in results if isinstance(r, upload_pb2.UploadFileResponse | upload_pb2.Upload)]
    refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(won) + len(refused) == 9, results
    assert len(won) == 3, f"{len(won)} small files and creates of 3 KiB in a 10 KiB quota"
    assert {(exc.code(), error_info(exc).reason) for exc in refused} == {(RE, "QUOTA_EXCEEDED")}


async def test_concurrent_new_versions_never_exceed_the_quota(cluster) -> None:
    # Nine 1-byte files, then a 3 KiB version of each at once: a new version's size counts
    # as soon as its row is updated, so the versions committed together see each other.
    alice = cluster["alice"]
    files = [(await _small_file(alice, 1, name=f"v-{n}")).file.file_id for n in range(9)]
    results = await asyncio.gather(
        *(_small_file(alice, 3 * CHUNK, file_id=f) for f in files), return_exceptions=True
    )
    # 9 bytes stored; each version needs 3 KiB of room and then stores 3 KiB - 1 more.
    _three_stored_six_refused(results, "versions")
