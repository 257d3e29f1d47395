"""Nothing is lost when the request running an inline merge dies: the merge job it held
(enqueued leased to it, in the transaction that won `merging`) is claimed by the job
runtime once the lease lapses, and the upload completes once (services/upload/merge/inline.py)."""

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
