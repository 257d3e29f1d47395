"""Nothing is lost, nothing doubled, when a request dies half-way.

- UploadFile (services/upload/merge/upload_file.py): killed after its bytes are stored and
  before its commit, it leaves bytes no row names; the client's retry makes the one
  version, and the reclaim sweep deletes the orphan.
- The last chunk of a small chunked upload (services/upload/merge/inline.py): the merge job
  it held (enqueued leased to it, in the transaction that won `merging`) is claimed by the
  job runtime once the lease lapses, and the upload completes once."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid

import pytest
from serentak.upload.v1 import upload_pb2
from sqlalchemy import select

from services.common.auth import Identity
from services.common.jobs import RuntimeOptions, Worker
from services.common.jobs.models import applied_jobs, jobs
from services.upload.models import COMPLETED, MERGING, FileRow, UploadRow
from services.upload.storage.blob_store import content_key
from services.upload.storage.lifecycle import ReclaimPolicy, reclaim

LEASE_S = 2.0
ALICE = Identity(tenant_id="acme", user_id="alice")


@pytest.fixture
def runtime_options() -> RuntimeOptions:
    """A short lease: a dead request's job is claimable again within LEASE_S."""
    return RuntimeOptions(
        node_id=f"test-{uuid.uuid4().hex[:6]}", poll_interval=0.05, lease_seconds=LEASE_S
    )


async def _upload(sessions, upload_id: str) -> UploadRow:
    async with sessions() as session:
        row = await session.get(UploadRow, upload_id)
        assert row is not None
        return row


async def test_upload_file_killed_before_its_commit_leaves_bytes_the_sweep_reclaims(
    parts,
) -> None:
    data = b"small file, request died between its bytes and its commit"
    checksum = hashlib.sha256(data).hexdigest()
    target = upload_pb2.NewFileTarget(name="crashed.txt")
    # What UploadFile does before its commit: the checks, then the bytes under the key of
    # the version it would make...
    prepared = await parts.uploads.prepare(
        ALICE,
        upload_pb2.CreateUploadRequest(
            client_request_id="crash-1",
            new_file=target,
            total_chunks=1,
            total_size=len(data),
            chunk_size=len(data),
            expected_checksum=checksum,
        ),
    )
    orphan = content_key(prepared.row.file_id, prepared.row.id)
    await parts.blobs.publish(await parts.blobs.stage(orphan, data), orphan)
    # ...and the process dies there: no row names the bytes. The client retries.
    retry = upload_pb2.UploadFileRequest(client_request_id="crash-1", new_file=target, data=data)
    done = await parts.upload_files.upload(ALICE, retry)
    again = await parts.upload_files.upload(ALICE, retry)
    assert done.upload.id == again.upload.id != prepared.row.id
    assert (done.upload.status, done.file.version, done.file.checksum) == (COMPLETED, 1, checksum)
    async with parts.sessions() as session:
        rows = (await session.execute(select(UploadRow.id))).scalars().all()
        files = (await session.execute(select(FileRow.name))).scalars().all()
    assert rows == [done.upload.id] and files.count("crashed.txt") == 1
    # The sweep (no grace here) deletes the orphan and keeps the version.
    await reclaim(
        parts.sessions, parts.blobs, ReclaimPolicy(orphan_grace_seconds=0, temp_grace_seconds=0)
    )
    assert not await parts.blobs.exists(orphan)
    assert await parts.blobs.read(content_key(done.file.id, done.upload.id)) == data


async def test_a_request_killed_after_winning_merging_leaves_the_merge_to_the_runtime(
    parts,
) -> None:
    data = b"small file, request died before its merge"
    upload = await parts.uploads.create(
        ALICE,
        upload_pb2.CreateUploadRequest(
            new_file=upload_pb2.NewFileTarget(name="orphan.txt"),
            total_chunks=1,
            total_size=len(data),
            chunk_size=len(data),
        ),
    )
    outcome = await parts.chunks.put(
        ALICE, upload.id, 0, data, hashlib.sha256(data).hexdigest(), claim=parts.inline.claim
    )
    # The request stops here (its process dies): the job is leased to it, nobody runs it.
    assert outcome.started_merge and outcome.claimed is not None
    assert (await _upload(parts.sessions, upload.id)).status == MERGING
    async with parts.sessions() as session:
        (job,) = (await session.execute(select(jobs))).all()
    assert (job.status, job.claimed_by, job.idempotency_key) == (
        "running",
        outcome.claimed.claimed_by,
        f"merge:{upload.id}",
    )
    # Another process's worker: it may claim the job only once the lease has lapsed.
    worker = Worker(parts.sessions, parts.registry, worker_id="survivor", poll_interval=0.05)
    started = time.monotonic()
    running = asyncio.create_task(worker.run())
    try:
        deadline = started + 30
        while (row := await _upload(parts.sessions, upload.id)).status != COMPLETED:
            assert time.monotonic() < deadline, f"upload stuck in {row.status}"
            await asyncio.sleep(0.05)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
    assert time.monotonic() - started >= LEASE_S * 0.9  # not before the lease lapsed
    assert row.file_version == 1
    async with parts.sessions() as session:
        file = await session.get(FileRow, row.file_id)
        assert file is not None and (file.version, file.size) == (1, len(data))
        applied = (
            await session.execute(
                select(applied_jobs).where(applied_jobs.c.idempotency_key == f"merge:{upload.id}")
            )
        ).all()
        assert len(applied) == 1
        assert (await session.execute(select(jobs.c.job_type))).scalars().all().count(
            "upload.merge"
        ) == 0
    assert await parts.blobs.read(content_key(row.file_id, upload.id)) == data
