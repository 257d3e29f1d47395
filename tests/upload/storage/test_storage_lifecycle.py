"""Storage lifecycle (services/upload/lifecycle): a completed upload's chunks go by the job
its commit enqueued; failed uploads' chunks and output after the grace; superseded
versions past retention; every version of a file the sync purge retired, at once; orphans
and temp files past their grace; bytes reclaimed counted. Both blob stores, SQLite and
PostgreSQL."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY
from serentak.upload.v1 import upload_pb2
from upload.upload_helpers import (
    chunk_request,
    chunk_row_count,
    create_request,
    download,
    split,
    wait_chunks_purged,
    wait_status,
)

from services.common.auth import Identity
from services.common.page_tokens import PageTokens
from services.upload.errors import ContentReplaced
from services.upload.files.listing_cache import ListingCache
from services.upload.files.retire import retire_files
from services.upload.files.use_cases import Files
from services.upload.models import FileRow, UploadRow, utcnow
from services.upload.storage.blob_store import content_key, upload_prefix
from services.upload.storage.lifecycle import ReclaimPolicy, reclaim

CHUNK = 1024
DEADLINE_S = 30


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    # The periodic sweep stays out of the way: tests run `reclaim` themselves.
    return {"reclaim_interval_seconds": 3600}


def _reclaimed(kind: str) -> float:
    return REGISTRY.get_sample_value("serentak_upload_bytes_reclaimed_total", {"kind": kind}) or 0.0


async def _upload(
    client, data: bytes, *, name: str = "f.bin", file_id: str = "", chunk: int = CHUNK, **kw
):
    if file_id:
        request = upload_pb2.CreateUploadRequest(
            file_id=file_id,
            total_chunks=len(split(data, chunk)),
            total_size=len(data),
            chunk_size=chunk,
            **kw,
        )
    else:
        request = create_request(data, chunk, name=name, **kw)
    up = await client.uploads.CreateUpload(request, metadata=client.metadata)
    for i, c in enumerate(split(data, chunk)):
        await client.uploads.PutChunk(chunk_request(up.upload_id, i, c), metadata=client.metadata)
    return await wait_status(
        client, up.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED, upload_pb2.UPLOAD_STATUS_FAILED
    )


async def _keys(blobs, prefix: str) -> list[str]:
    return sorted([o.key async for o in blobs.list_objects(prefix)])


@pytest.mark.parametrize("blob_backend", ["local", "s3"])
async def test_completed_chunks_purged_by_the_commit_job(cluster, sessions) -> None:
    alice = cluster["alice"]
    before = _reclaimed("completed_chunks")
    data = os.urandom(CHUNK * 3 + 7)
    done = await _upload(alice, data)
    assert done.status == upload_pb2.UPLOAD_STATUS_COMPLETED
    # The purge job runs after the commit; wait for its observable end.
    await wait_chunks_purged(sessions, done.upload_id, "the commit's purge job")
    assert await _keys(cluster.blobs, upload_prefix(done.upload_id)) == []
    # The rows stay: a late retry of a chunk is still a duplicate, other bytes a conflict.
    assert await chunk_row_count(sessions, done.upload_id) == 4
    chunks = split(data, CHUNK)
    again = await alice.uploads.PutChunk(
        chunk_request(done.upload_id, 1, chunks[1]), metadata=alice.metadata
    )
    assert again.duplicate
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await alice.uploads.PutChunk(
            chunk_request(done.upload_id, 1, os.urandom(CHUNK)), metadata=alice.metadata
        )
    assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert await _keys(cluster.blobs, upload_prefix(done.upload_id)) == []
    assert _reclaimed("completed_chunks") - before == len(data)
    # The file itself is intact.
    got, _ = await download(alice, done.file_id)
    assert got == data


@pytest.mark.parametrize("blob_backend", ["local", "s3"])
async def test_reclaim_failed_versions_and_orphans(cluster, sessions) -> None:
    alice = cluster["alice"]
    blobs = cluster.blobs
    # A failed upload (the whole-file checksum is wrong): chunks stay for the grace period.
    bad = os.urandom(CHUNK * 2)
    failed = await _upload(alice, bad, name="bad.bin", expected_checksum="0" * 64)
    assert failed.status == upload_pb2.UPLOAD_STATUS_FAILED
    # A merge output written but never committed (as a merge that failed at commit leaves).
    stray_output = content_key(failed.file_id, failed.upload_id)
    staged = await blobs.stage(stray_output, b"x" * 100)
    await blobs.publish(staged, stray_output)
    await blobs.discard(staged)
    # Three versions of one file.
    versions = [os.urandom(CHUNK + i) for i in range(3)]
    first = await _upload(alice, versions[0], name="v.bin")
    ups = [first]
    for data in versions[1:]:
        ups.append(await _upload(alice, data, file_id=first.file_id))
    assert [u.status for u in ups] == [upload_pb2.UPLOAD_STATUS_COMPLETED] * 3
    # Orphans: bytes no row names.
    for key in ("files/nofile/noupload", "uploads/noupload/0"):
        staged = await blobs.stage(key, b"o" * 50)
        await blobs.publish(staged, key)
        await blobs.discard(staged)
    # An upload in progress: its chunk must survive every step.
    live = await alice.uploads.CreateUpload(
        create_request(os.urandom(CHUNK * 2), CHUNK, name="live.bin"), metadata=alice.metadata
    )
    await alice.uploads.PutChunk(
        chunk_request(live.upload_id, 0, b"l" * CHUNK), metadata=alice.metadata
    )

    # Inside every grace period nothing is deleted.
    policy = ReclaimPolicy(
        failed_grace_seconds=600,
        version_keep_count=1,
        version_keep_days=1,
        orphan_grace_seconds=600,
        temp_grace_seconds=600,
    )
    quiet = await reclaim(sessions, blobs, policy)
    assert quiet.objects == 0
    assert await _keys(blobs, upload_prefix(failed.upload_id))

    before = {k: _reclaimed(k) for k in ("failed_chunks", "failed_output", "old_version", "orphan")}
    later = utcnow() + timedelta(days=2)
    result = await reclaim(sessions, blobs, policy, now=later)
    assert result.bytes["failed_chunks"] == len(bad)
    assert result.bytes["failed_output"] == 100
    assert result.bytes["old_version"] == len(versions[0]) + len(versions[1])
    assert result.bytes["orphan"] == 100
    for kind, value in before.items():
        assert _reclaimed(kind) - value == result.bytes[kind]
    assert await _keys(blobs, upload_prefix(failed.upload_id)) == []
    assert await chunk_row_count(sessions, failed.upload_id) == 2
    assert not await blobs.exists(stray_output)
    files = await _keys(blobs, f"files/{first.file_id}")
    assert files == [content_key(first.file_id, ups[2].upload_id)]
    assert not await blobs.exists("files/nofile/noupload")
    assert not await blobs.exists("uploads/noupload/0")
    # The upload in progress kept its chunk, and finishes.
    assert await _keys(blobs, upload_prefix(live.upload_id)) == [f"uploads/{live.upload_id}/0"]
    got, _ = await download(alice, first.file_id)
    assert got == versions[2]
    # A second run finds nothing more.
    again = await reclaim(sessions, blobs, policy, now=later)
    assert again.objects == 0


@pytest.mark.parametrize("blob_backend", ["local", "s3"])
async def test_retired_files_bytes_go_with_the_next_run(cluster, sessions) -> None:
    alice = cluster["alice"]
    blobs = cluster.blobs
    versions = [os.urandom(CHUNK + i) for i in range(2)]
    first = await _upload(alice, versions[0], name="gone.bin")
    second = await _upload(alice, versions[1], file_id=first.file_id)
    kept_data = os.urandom(CHUNK)
    kept = await _upload(alice, kept_data, name="kept.bin")
    assert len(await _keys(blobs, f"files/{first.file_id}")) == 2
    before = _reclaimed("retired")
    # The sync purge retires the file (its row goes; its uploads stay).
    async with sessions.begin() as session:
        assert await retire_files(session, [first.file_id]) == {first.file_id}
    # Every grace period long: retired bytes need none (nothing can read them again).
    policy = ReclaimPolicy(version_keep_count=5, version_keep_days=30)
    result = await reclaim(sessions, blobs, policy)
    assert result.bytes["retired"] == len(versions[0]) + len(versions[1])
    assert _reclaimed("retired") - before == result.bytes["retired"]
    assert await _keys(blobs, f"files/{first.file_id}") == []
    for up in (first, second):
        assert await _keys(blobs, upload_prefix(up.upload_id)) == []
        # Its bytes gone, nothing can read the upload again: its rows go too (step 6).
        async with sessions() as session:
            assert await session.get(UploadRow, up.upload_id) is None
        assert await chunk_row_count(sessions, up.upload_id) == 0
    async with sessions() as session:
        assert await session.get(UploadRow, kept.upload_id) is not None
    # Another file is untouched, and a second run finds nothing.
    got, _ = await download(alice, kept.file_id)
    assert got == kept_data
    assert (await reclaim(sessions, blobs, policy)).bytes["retired"] == 0


async def test_keep_count_and_days(cluster, sessions) -> None:
    alice = cluster["alice"]
    versions = [os.urandom(CHUNK + i) for i in range(3)]
    first = await _upload(alice, versions[0], name="keep.bin")
    ups = [first] + [await _upload(alice, d, file_id=first.file_id) for d in versions[1:]]
    prefix = f"files/{first.file_id}"
    # Keep 2 versions: only v1 is past the count, but it is younger than the days.
    policy = ReclaimPolicy(version_keep_count=2, version_keep_days=1)
    await reclaim(sessions, cluster.blobs, policy)
    assert len(await _keys(cluster.blobs, prefix)) == 3
    # Two days on: v1 goes, the newest two stay.
    await reclaim(sessions, cluster.blobs, policy, now=utcnow() + timedelta(days=2))
    assert await _keys(cluster.blobs, prefix) == sorted(
        content_key(first.file_id, u.upload_id) for u in ups[1:]
    )


@pytest.mark.parametrize("blob_backend", ["local", "s3"])
async def test_deleting_an_old_version_while_it_downloads(cluster, sessions) -> None:
    """Racing the retention sweep against downloads of the version it deletes: each
    download returns that version's exact bytes or ends ABORTED/CONTENT_REPLACED."""
    alice = cluster["alice"]
    old = os.urandom(3 * 1024 * 1024 + 11)  # several 1 MiB download blocks
    first = await _upload(alice, old, name="race.bin", chunk=1024 * 1024)
    policy = ReclaimPolicy(version_keep_count=1, version_keep_days=0)
    outcomes = {"complete": 0, "replaced": 0}
    current = old
    for round_ in range(4):
        calls = [
            alice.files.Download(
                upload_pb2.DownloadRequest(file_id=first.file_id), metadata=alice.metadata
            )
            for _ in range(3)
        ]
        firsts = [await call.read() for call in calls]
        # A new version, then the sweep deletes the one the downloads are reading.
        new = os.urandom(CHUNK * 2 + round_)
        await _upload(alice, new, file_id=first.file_id)
        deleted = await reclaim(sessions, cluster.blobs, policy)
        assert deleted.bytes["old_version"] == len(current)
        for call, head in zip(calls, firsts, strict=True):
            parts = [head.data]
            try:
                while (block := await call.read()) is not grpc.aio.EOF:
                    parts.append(block.data)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.ABORTED, exc
                assert "CONTENT_REPLACED" in str(exc.trailing_metadata()), exc
                assert current.startswith(b"".join(parts))
                outcomes["replaced"] += 1
                continue
            assert b"".join(parts) == current
            outcomes["complete"] += 1
        current = new
    print(f"downloads racing deletion: {outcomes}")
    assert sum(outcomes.values()) == 12


@pytest.mark.parametrize("blob_backend", ["local", "s3"])
async def test_a_download_whose_version_is_deleted_before_it_opens_is_aborted(
    cluster, sessions
) -> None:
    """The other side of the race, made deterministic: the download resolved the old
    version, the sweep deleted it before the first byte was read: ABORTED/CONTENT_REPLACED."""
    alice = cluster["alice"]
    old = os.urandom(CHUNK * 2)
    first = await _upload(alice, old, name="gone.bin")
    async with sessions() as session:
        row = await session.get(FileRow, first.file_id)
        identity = Identity(tenant_id=row.tenant_id, user_id=row.owner_user_id)
    files = Files(sessions, cluster.blobs, ListingCache(10), PageTokens("t" * 32))
    _, blocks = await files.open_download(
        identity, upload_pb2.DownloadRequest(file_id=first.file_id)
    )
    await _upload(alice, os.urandom(CHUNK), file_id=first.file_id)
    deleted = await reclaim(
        sessions,
        cluster.blobs,
        ReclaimPolicy(failed_grace_seconds=1, version_keep_count=1, version_keep_days=0),
    )
    assert deleted.bytes["old_version"] == len(old)
    with pytest.raises(ContentReplaced):
        async for _ in blocks:
            pass


async def test_sweep_removes_only_old_temp_files(cluster, sessions) -> None:
    """A killed merge's `*.merge-tmp` (and a killed chunk write's `.tmp`) go once older than
    the temp grace; a fresh one (a live write) stays. (The killed-process case, where the
    re-run merge removes its predecessor's: test_merge_crash_recovery.py.)"""
    root = cluster.settings.blob_root
    folder = root / "files" / "f1"
    folder.mkdir(parents=True, exist_ok=True)
    old = folder / ".u1.123-abc-0.merge-tmp"
    old.write_bytes(b"m" * 300)
    chunk_tmp = root / "uploads" / "u2" / ".0.deadbeef.tmp"
    chunk_tmp.parent.mkdir(parents=True, exist_ok=True)
    chunk_tmp.write_bytes(b"c" * 20)
    policy = ReclaimPolicy(temp_grace_seconds=3600, orphan_grace_seconds=10 * 24 * 3600)
    before = _reclaimed("temp")
    # Now: both are younger than the grace (a live merge could be writing them).
    assert (await reclaim(sessions, cluster.blobs, policy)).bytes["temp"] == 0
    assert old.exists() and chunk_tmp.exists()
    result = await reclaim(sessions, cluster.blobs, policy, now=utcnow() + timedelta(hours=2))
    assert result.bytes["temp"] == 320
    assert _reclaimed("temp") - before == 320
    assert not old.exists() and not chunk_tmp.exists()
