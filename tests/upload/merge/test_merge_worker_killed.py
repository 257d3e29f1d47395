"""A merge worker SIGKILLed mid-merge: the upload still completes, exactly once."""

from __future__ import annotations

import os
import uuid

from upload.upload_helpers import (
    chunk_request,
    content_updated_uploads,
    create_request,
    file_lock_client,
    split,
)
from upload.upload_process import ALICE, kill, upload_env, upload_process, wait_completed, wait_for

CHUNK = 4096


async def test_killed_merge_worker_still_completes_once(
    database_url, tmp_path, locks_address
) -> None:
    env = upload_env(database_url, locks_address, worker_lease_seconds="2")
    data = os.urandom(CHUNK * 6 + 10)
    holder = file_lock_client(locks_address, owner=f"blocker-{uuid.uuid4().hex[:6]}")
    async with upload_process(tmp_path, env) as (proc, stub):
        upload = await stub.CreateUpload(create_request(data, CHUNK), metadata=ALICE)
        # Park the merge after merge_core, waiting for the file lock we hold.
        lock = await holder.acquire(f"file:{upload.file_id}", ttl=30, wait_timeout=5)
        for i, c in enumerate(split(data, CHUNK)):
            await stub.PutChunk(chunk_request(upload.upload_id, i, c), metadata=ALICE)
        await wait_for(
            lambda: '"job_started"' in proc.log_text(),
            lambda: f"never logged job_started: {proc.log_text()[-2000:]}",
        )
        kill(proc)
    await holder.release(f"file:{upload.file_id}", lock.token)
    await holder.close()
    async with upload_process(tmp_path, env) as (proc, stub):
        done = await wait_completed(stub, upload.upload_id)
        assert done.file_version == 1
        merged = tmp_path / "data" / "blobs" / "files" / done.file_id / done.upload_id
        assert merged.read_bytes() == data
    assert await content_updated_uploads(database_url) == [upload.upload_id]
