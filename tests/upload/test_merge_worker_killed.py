"""A merge worker SIGKILLed mid-merge: the upload still completes, exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid

import grpc
from serentak.events.v1 import events_pb2
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from sqlalchemy import select
from support.services import service_process
from upload.upload_helpers import chunk_request, create_request, split, wait_status

from services.common.db import create_engine, session_factory
from services.common.outbox.models import outbox_events
from services.locks.client import LockClient

CHUNK = 4096


async def _wait_for_log(proc, needle: str, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while needle not in proc.log_text():
        assert time.monotonic() < deadline, f"never logged {needle!r}: {proc.log_text()[-2000:]}"
        await asyncio.sleep(0.05)


async def test_killed_merge_worker_still_completes_once(
    database_url, tmp_path, locks_address
) -> None:
    env = {
        "SERENTAK_UPLOAD_DATABASE_URL": database_url,
        "SERENTAK_LOCKS_ADDRESS": locks_address,
        "SERENTAK_MIN_CHUNK_SIZE": "1024",
        "SERENTAK_WORKER_LEASE_SECONDS": "2",
        "SERENTAK_WORKER_POLL_SECONDS": "0.1",
        "SERENTAK_LOG_FORMAT": "json",
        # Any free port: the default 8181 may be taken by another service on the host.
        "SERENTAK_SYNC_WEBHOOK_PORT": "0",
    }
    md = (("authorization", "Bearer dev-alice"),)
    data = os.urandom(CHUNK * 6 + 10)
    holder = LockClient(locks_address, owner=f"blocker-{uuid.uuid4().hex[:6]}", token="dev-alice")
    with contextlib.ExitStack() as stack:
        proc = await asyncio.to_thread(
            stack.enter_context, service_process("upload", tmp_path, env)
        )
        async with grpc.aio.insecure_channel(proc.address) as channel:
            stub = upload_pb2_grpc.UploadServiceStub(channel)
            upload = await stub.CreateUpload(create_request(data, CHUNK), metadata=md)
            # Park the merge after merge_core, waiting for the file lock we hold.
            lock = await holder.acquire(f"file:{upload.file_id}", ttl=30, wait_timeout=5)
            for i, c in enumerate(split(data, CHUNK)):
                await stub.PutChunk(chunk_request(upload.upload_id, i, c), metadata=md)
            await _wait_for_log(proc, '"job_started"')
        proc.process.send_signal(signal.SIGKILL)
        proc.process.wait()
    await holder.release(f"file:{upload.file_id}", lock.token)
    await holder.close()
    with contextlib.ExitStack() as stack:
        proc = await asyncio.to_thread(
            stack.enter_context, service_process("upload", tmp_path, env)
        )
        async with grpc.aio.insecure_channel(proc.address) as channel:
            client = type("C", (), {})()
            client.uploads = upload_pb2_grpc.UploadServiceStub(channel)
            client.metadata = md
            done = await wait_status(client, upload.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
            assert done.file_version == 1
            merged = tmp_path / "data" / "blobs" / "files" / done.file_id / done.upload_id
            assert merged.read_bytes() == data
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            rows = (await session.execute(select(outbox_events.c.event))).scalars()
            events = [events_pb2.Event.FromString(r) for r in rows]
    finally:
        await engine.dispose()
    content = [e for e in events if e.event_type == "file.content.updated"]
    assert [e.file_content_updated.upload_id for e in content] == [upload.upload_id]
