"""A merge that dies for good never leaves its upload stuck in `merging`.

- The handler's last attempt (a chunk blob that cannot be read; a file lock that stays
  held) records `failed` with the reason, and the job is still dead-lettered.
- A merge job dead-lettered by the runtime without its handler running (the crash-loop
  guard: every attempt lost its worker) is failed by the periodic sweep; one whose dead
  letter was replayed is left to the replay, which completes it.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any

import pytest
from serentak.upload.v1 import upload_pb2
from upload.conftest import upload_settings
from upload.upload_helpers import (
    chunk_request,
    create_request,
    file_lock_client,
    put_chunks,
    sha256,
    split,
    wait_status,
)

from services.common.auth import Identity
from services.common.db import create_engine, session_factory
from services.common.jobs.dead_letters import list_dead_letters, replay_dead_letter
from services.common.jobs.queue import claim_jobs
from services.common.jobs.worker import Worker
from services.upload.components import build_components
from services.upload.database import migrate
from services.upload.merge.merge_job import MERGE_JOB
from services.upload.merge.stuck_merges import fail_dead_merges
from services.upload.models import UploadRow
from services.upload.storage.blob_store import chunk_key, content_key
from services.upload.sync.settings import SyncSettings

CHUNK = 1024
DEADLINE_S = 60.0


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    # Two attempts, tiny backoff, a short lock wait: giving up takes well under a second.
    return {
        "merge_max_attempts": 2,
        "merge_retry_base_seconds": 0.01,
        "merge_retry_cap_seconds": 0.05,
        "merge_lock_wait_ms": 300,
    }


async def _merge_dead_letters(database_url: str, upload_id: str) -> list[dict[str, Any]]:
    """Dead letters of the merge job of `upload_id`, once at least one is there."""
    engine = create_engine(database_url)
    try:
        sessions = session_factory(engine)
        deadline = time.monotonic() + DEADLINE_S
        while True:
            async with sessions() as session:
                rows = await list_dead_letters(session, job_type=MERGE_JOB)
            mine = [r for r in rows if r["idempotency_key"] == f"merge:{upload_id}"]
            if mine:
                return mine
            assert time.monotonic() < deadline, "the merge job was never dead-lettered"
            await asyncio.sleep(0.02)
    finally:
        await engine.dispose()


@pytest.mark.parametrize("blob_backend", ["local", "s3"])
async def test_unreadable_chunk_blob_fails_the_upload_after_the_last_attempt(cluster) -> None:
    alice = cluster["alice"]
    data = os.urandom(CHUNK * 3)
    chunks = split(data, CHUNK)
    upload = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    await put_chunks(alice, upload.upload_id, chunks, (0, 1))
    # The stored chunk vanishes from the store: the merge cannot read it (MergeIOError
    # locally, BlobStoreUnavailable on S3; both transient and retried up to the bound).
    await cluster.blobs.delete(chunk_key(upload.upload_id, 1))
    await alice.uploads.PutChunk(
        chunk_request(upload.upload_id, 2, chunks[2]), metadata=alice.metadata
    )
    failed = await wait_status(
        alice, upload.upload_id, upload_pb2.UPLOAD_STATUS_FAILED, upload_pb2.UPLOAD_STATUS_COMPLETED
    )
    assert failed.status == upload_pb2.UPLOAD_STATUS_FAILED
    assert "attempt 2" in failed.failure_reason
    assert "merge I/O error" in failed.failure_reason
    assert failed.file_version == 0
    dead = await _merge_dead_letters(cluster.settings.database_url, upload.upload_id)
    assert [(d["attempts"], d["error_class"]) for d in dead] == [(2, "transient")]
    assert not await cluster.blobs.exists(content_key(upload.file_id, upload.upload_id))


async def test_file_lock_held_past_every_attempt_fails_the_upload(cluster, locks_address) -> None:
    alice = cluster["alice"]
    data = os.urandom(CHUNK * 2)
    upload = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    key = f"file:{upload.file_id}"
    holder = file_lock_client(locks_address, owner=f"blocker-{uuid.uuid4().hex[:6]}")
    lock = await holder.acquire(key, ttl=60, wait_timeout=5)
    try:
        await put_chunks(alice, upload.upload_id, split(data, CHUNK))
        failed = await wait_status(
            alice,
            upload.upload_id,
            upload_pb2.UPLOAD_STATUS_FAILED,
            upload_pb2.UPLOAD_STATUS_COMPLETED,
        )
    finally:
        await holder.release(key, lock.token)
        await holder.close()
    assert failed.status == upload_pb2.UPLOAD_STATUS_FAILED
    assert "TransientError: file lock" in failed.failure_reason
    dead = await _merge_dead_letters(cluster.settings.database_url, upload.upload_id)
    assert [d["attempts"] for d in dead] == [2]


# --- the sweep: a merge job dead-lettered without its handler running -------------------


@pytest.fixture
async def components(database_url, tmp_path, locks_address, runtime_options):
    """The upload service's parts on a migrated database, no runtime running (the test
    drives workers itself); one attempt per merge job."""
    migrate(database_url)
    settings = upload_settings(database_url, tmp_path, locks_address, merge_max_attempts=1)
    parts = build_components(settings, runtime_options, SyncSettings(webhook_port=0))
    yield parts
    await parts.close()


async def _merging_upload(parts, identity: Identity, name: str) -> tuple[str, bytes]:
    data = os.urandom(CHUNK + 17)
    row = await parts.uploads.create(identity, create_request(data, CHUNK, name=name))
    for i, c in enumerate(split(data, CHUNK)):
        outcome = await parts.chunks.put(identity, row.id, i, c, sha256(c))
    assert outcome.started_merge
    return row.id, data


async def _crash_loop_merge(parts, upload_id: str) -> None:
    """Let the merge job of `upload_id` die the way a crash-looping worker makes it die.

    A 'worker' claims it and vanishes (its lease simply runs out); the next claim is
    attempt 2 > max_attempts 1, so the runtime's guard raises WorkerLost and dead-letters
    the job without calling the handler.
    """
    async with parts.sessions.begin() as session:
        claimed = await claim_jobs(session, "vanished-worker", [MERGE_JOB], 0.2, limit=1)
    assert [c.idempotency_key for c in claimed] == [f"merge:{upload_id}"]
    worker = Worker(parts.sessions, parts.registry, worker_id="guard", lease_seconds=10)
    deadline = time.monotonic() + DEADLINE_S
    # Waits for the abandoned lease to end (a test about time: the lease is 0.2 s).
    while not await worker.run_once():
        assert time.monotonic() < deadline, "the abandoned lease never ended"
        await asyncio.sleep(0.05)


async def test_sweep_fails_a_merge_dead_lettered_before_its_handler_ran(components) -> None:
    parts = components
    alice = Identity(tenant_id="t-sweep", user_id="alice")
    # One at a time: the guard's claim must find only the abandoned job.
    dead_id, _ = await _merging_upload(parts, alice, "dead.bin")
    await _crash_loop_merge(parts, dead_id)
    replayed_id, replayed_data = await _merging_upload(parts, alice, "replayed.bin")
    await _crash_loop_merge(parts, replayed_id)
    async with parts.sessions() as session:
        letters = {
            d["idempotency_key"]: d for d in await list_dead_letters(session, job_type=MERGE_JOB)
        }
    assert letters[f"merge:{dead_id}"]["error_type"].endswith("WorkerLost")
    async with parts.sessions.begin() as session:
        replay = await replay_dead_letter(session, letters[f"merge:{replayed_id}"]["id"])
    assert replay.enqueued

    # The handler never ran: both are still merging until the sweep looks.
    async with parts.sessions() as session:
        statuses = {u: (await session.get(UploadRow, u)).status for u in (dead_id, replayed_id)}
    assert statuses == {dead_id: "merging", replayed_id: "merging"}

    assert await fail_dead_merges(parts.sessions) == 1
    assert await fail_dead_merges(parts.sessions) == 0  # nothing left: no second effect
    async with parts.sessions() as session:
        dead = await session.get(UploadRow, dead_id)
        assert dead.status == "failed"
        assert dead.failure_reason.startswith("merge job dead-lettered: WorkerLost")
        assert dead.merge_finished_at is not None
        assert (await session.get(UploadRow, replayed_id)).status == "merging"

    # The replay goes through the real handler and completes its upload.
    worker = Worker(parts.sessions, parts.registry, worker_id="replayer", lease_seconds=10)
    assert await worker.run_once()
    async with parts.sessions() as session:
        done = await session.get(UploadRow, replayed_id)
        assert (done.status, done.file_version) == ("completed", 1)
    merged = parts.settings.blob_root / "files" / done.file_id / replayed_id
    assert merged.read_bytes() == replayed_data
    # The failed upload stays failed: status only moves forward.
    assert await fail_dead_merges(parts.sessions) == 0
