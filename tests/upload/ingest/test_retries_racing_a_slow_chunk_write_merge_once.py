"""Seed 004 repro harness, second half: a server-side delay between a chunk's write and the
upload's status update (the test-only `services.upload.ingest.chunks.after_chunk_write` hook, off
in every deployment), with retries of the same chunk racing into that window. For even
indexes the client gives up on the delayed call (cancelled while the server sits between
write and update), for odd ones it waits; either way two retries are sent while the first
call is held. The upload ends with exactly one merge, one content event, one row per
index and identical bytes. SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import time

import grpc
from prometheus_client import REGISTRY
from serentak.events.v1 import events_pb2
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from sqlalchemy import func, select
from upload.upload_helpers import chunk_request, create_request, download, split, wait_status

from services.common.db import create_engine, session_factory
from services.common.outbox.models import outbox_events
from services.upload.ingest import chunks as chunk_module
from services.upload.models import ChunkRow

CHUNK = 64 * 1024
RETRIES = 2


def _received() -> float:
    return REGISTRY.get_sample_value("serentak_upload_bytes_received_total") or 0.0


def _merges() -> float:
    return (
        REGISTRY.get_sample_value("serentak_upload_merges_total", {"outcome": "completed"}) or 0.0
    )


async def test_delayed_status_update_with_racing_retries_merges_once(cluster, monkeypatch) -> None:
    alice = cluster["alice"]
    data = os.urandom(CHUNK * 4 + 77)
    chunks = split(data, CHUNK)
    up = await alice.uploads.CreateUpload(create_request(data, CHUNK), metadata=alice.metadata)
    merges = _merges()

    held: asyncio.Queue[int] = asyncio.Queue()
    delayed: set[int] = set()
    release: dict[int, asyncio.Event] = {i: asyncio.Event() for i in range(len(chunks))}

    async def delay(upload_id: str, index: int) -> None:
        # Only an inserter of the index's row reaches here. The first waits, its
        # transaction open, until the test has its retries in flight; a retry that
        # inserts after a cancelled first rolled back passes straight on.
        if upload_id == up.upload_id and index not in delayed:
            delayed.add(index)
            held.put_nowait(index)
            await release[index].wait()

    monkeypatch.setattr(chunk_module, "after_chunk_write", delay)

    for i, piece in enumerate(chunks):
        channel = grpc.aio.insecure_channel(cluster.address)
        stub = upload_pb2_grpc.UploadServiceStub(channel)
        first = stub.PutChunk(chunk_request(up.upload_id, i, piece), metadata=alice.metadata)
        async with asyncio.timeout(30):
            assert await held.get() == i  # the server wrote the bytes and now waits
        if i % 2 == 0:
            first.cancel()  # the client gives up: its connection goes too
        before = _received()
        retries = [
            asyncio.ensure_future(
                alice.uploads.PutChunk(
                    chunk_request(up.upload_id, i, piece), metadata=alice.metadata
                )
            )
            for _ in range(RETRIES)
        ]
        # The retries have reached the server (their bytes are counted) before the first
        # call's transaction is let go.
        deadline = time.monotonic() + 30
        while _received() - before < RETRIES * len(piece):
            assert time.monotonic() < deadline, "the retries never reached the server"
            await asyncio.sleep(0.01)
        release[i].set()
        outcomes = await asyncio.gather(first, *retries, return_exceptions=True)
        await channel.close()
        answers = [o for o in outcomes if isinstance(o, upload_pb2.PutChunkResponse)]
        others = [o for o in outcomes if not isinstance(o, upload_pb2.PutChunkResponse)]
        # Only a cancelled first call may have no answer; no retry fails.
        assert all(
            isinstance(o, asyncio.CancelledError)
            or (isinstance(o, grpc.aio.AioRpcError) and o.code() == grpc.StatusCode.CANCELLED)
            for o in others
        ), others
        assert len(answers) >= RETRIES
        # The cancelled writer's transaction rolled back (a retry stored the chunk) or
        # committed before the cancel reached it: never both, never neither.
        assert sum(not a.duplicate for a in answers) <= 1, answers
        if i % 2:
            # The held first call stored the chunk; both retries waited it out as duplicates.
            assert [a.duplicate for a in answers] == [False] + [True] * RETRIES, answers

    done = await wait_status(alice, up.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
    got, _ = await download(alice, done.file_id)
    assert got == data
    assert _merges() - merges == 1
    engine = create_engine(cluster.settings.database_url)
    try:
        async with session_factory(engine)() as session:
            rows = (await session.execute(select(outbox_events.c.event))).scalars()
            events = [events_pb2.Event.FromString(r) for r in rows]
            per_index = (
                await session.execute(
                    select(ChunkRow.chunk_index, func.count())
                    .where(ChunkRow.upload_id == up.upload_id)
                    .group_by(ChunkRow.chunk_index)
                    .order_by(ChunkRow.chunk_index)
                )
            ).all()
    finally:
        await engine.dispose()
    assert [tuple(r) for r in per_index] == [(i, 1) for i in range(len(chunks))]
    content = [e for e in events if e.event_type == "file.content.updated"]
    assert [e.file_content_updated.upload_id for e in content] == [up.upload_id]


def test_the_hook_is_off_by_default() -> None:
    # Nothing outside a test's own process can switch it on (no setting reads it).
    assert chunk_module.after_chunk_write is None
