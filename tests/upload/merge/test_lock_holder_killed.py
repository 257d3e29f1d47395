"""A process holding a file lock is SIGKILLed (seed: crash while a lock is held): the lock
frees within its short lease (the next Acquire, waiting at most three TTLs, gets it), the
next holder's fencing token is larger, and a write still carrying the dead holder's token
is refused (ABORTED/STALE_FENCING_TOKEN) leaving the file as the new holder wrote it.
SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid

import pytest
from serentak.upload.v1 import upload_pb2
from support.services import REPO_ROOT
from upload.upload_helpers import chunk_request, create_request, file_lock_client, wait_status

from services.common.db import create_engine, session_factory
from services.upload.errors import StaleFencingToken
from services.upload.files.versions import commit_fenced
from services.upload.models import FileRow

TTL = 2
HOLDER = """
import asyncio, sys
from serentak.sdk.locks import LockClient

async def main() -> None:
    client = LockClient(sys.argv[1], owner="doomed", token="dev-ops", tenant_id="acme")
    async with client.hold(sys.argv[2], ttl=int(sys.argv[3]), wait_timeout=10) as held:
        print(held.token, flush=True)
        await asyncio.Event().wait()  # holds (Hold keeps the lease alive) until killed

asyncio.run(main())
"""


@pytest.fixture
async def lock_client(locks_address: str):
    client = file_lock_client(locks_address, owner=f"next-{uuid.uuid4().hex[:6]}")
    yield client
    await client.close()


async def test_killed_holders_lock_frees_and_its_token_is_refused(
    cluster, locks_address, lock_client
) -> None:
    alice = cluster["alice"]
    up = await alice.uploads.CreateUpload(create_request(b"v1", 1024), metadata=alice.metadata)
    await alice.uploads.PutChunk(chunk_request(up.upload_id, 0, b"v1"), metadata=alice.metadata)
    done = await wait_status(alice, up.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    key = f"file:{done.file_id}"

    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
    }
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HOLDER,
        locks_address,
        key,
        str(TTL),
        cwd=REPO_ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        dead_token = int(await holder.stdout.readline())
        state = await lock_client.describe(key)
        assert state.held and state.lock.token == dead_token
        holder.send_signal(signal.SIGKILL)
        assert await holder.wait() == -signal.SIGKILL
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()

    # Nobody releases it: the lease runs out and the waiter gets the lock.
    fresh = await lock_client.acquire(key, ttl=10, wait_timeout=3 * TTL)
    assert fresh.token > dead_token
    engine = create_engine(cluster.settings.database_url)
    sessions = session_factory(engine)
    try:
        async with sessions.begin() as session:
            await commit_fenced(session, done.file_id, fresh.token, size=222)
        # The dead holder's write, arriving late (a request it sent before dying).
        with pytest.raises(StaleFencingToken):
            async with sessions.begin() as session:
                await commit_fenced(session, done.file_id, dead_token, size=999)
        async with sessions() as session:
            row = await session.get(FileRow, done.file_id)
            assert row is not None
            assert (row.size, row.last_lock_token) == (222, fresh.token)
    finally:
        await lock_client.release(key, fresh.token)
        await engine.dispose()
