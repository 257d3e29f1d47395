"""The seed's race harness (invariants 2, 3, 4, 6): 200 uploads, chunks shuffled and sent
1-3 times each by many concurrent senders with random delays, some with racing final
chunks. Every upload merges exactly once and the file is byte-identical to the source."""

from __future__ import annotations

import asyncio
import os
import random

import grpc
import pytest
from serentak.events.v1 import events_pb2
from serentak.upload.v1 import upload_pb2
from sqlalchemy import func, select
from upload.upload_helpers import chunk_request, create_request, sha256, split, wait_status

from services.common.db import create_engine, session_factory
from services.common.outbox.models import outbox_events
from services.upload.models import COMPLETED, ChunkRow, FileRow, UploadRow
from services.upload.storage.blob_store import content_key

UPLOADS = 200
SENDERS = 24


@pytest.fixture
def settings_overrides() -> dict[str, object]:
    """Durability is not under test here: skip fsyncs so 200 uploads stay quick. All 200 are
    open at once, past the default per-user cap (tested in test_upload_limits.py)."""
    return {
        "blob_fsync": False,
        "sqlite_synchronous": "NORMAL",
        "max_open_uploads_per_user": UPLOADS,
    }


async def test_every_upload_merges_exactly_once(cluster) -> None:
    alice = cluster["alice"]
    rng = random.Random(7)
    sources: dict[str, bytes] = {}
    work: list[tuple[str, int, bytes]] = []
    racing_finals: list[list[tuple[str, int, bytes]]] = []
    for n in range(UPLOADS):
        chunk_size = rng.choice([1024, 2048, 4096])
        data = os.urandom(rng.randint(1, 8 * chunk_size))
        upload = await alice.uploads.CreateUpload(
            create_request(
                data,
                chunk_size,
                name=f"race-{n}",
                client_request_id=f"race-{n}",
                expected_checksum=sha256(data),
            ),
            metadata=alice.metadata,
        )
        sources[upload.upload_id] = data
        chunks = split(data, chunk_size)
        sends = [
            (upload.upload_id, i, c) for i, c in enumerate(chunks) for _ in range(rng.randint(1, 3))
        ]
        if n % 5 == 0 and len(chunks) >= 2:
            # The final two chunks race each other, 3 copies each, after the rest is stored.
            last = {len(chunks) - 1, len(chunks) - 2}
            racing_finals.append([s for s in sends if s[1] in last] * 3)
            sends = [s for s in sends if s[1] not in last]
        work += sends
    rng.shuffle(work)
    queue: asyncio.Queue[tuple[str, int, bytes]] = asyncio.Queue()
    for item in work:
        queue.put_nowait(item)

    async def sender() -> None:
        while not queue.empty():
            upload_id, index, data = queue.get_nowait()
            await asyncio.sleep(rng.random() * 0.003)
            try:
                await alice.uploads.PutChunk(
                    chunk_request(upload_id, index, data), metadata=alice.metadata
                )
            except grpc.aio.AioRpcError as exc:
                # The only acceptable refusal: a duplicate arriving after the merge started
                # is still answered as a duplicate, so nothing should fail here.
                raise AssertionError(f"{exc.code()}: {exc.details()}") from exc

    await asyncio.gather(*(sender() for _ in range(SENDERS)))
    for group in racing_finals:
        await asyncio.gather(
            *(
                alice.uploads.PutChunk(chunk_request(u, i, d), metadata=alice.metadata)
                for u, i, d in group
            )
        )

    for upload_id, data in sources.items():
        done = await wait_status(
            alice, upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED, upload_pb2.UPLOAD_STATUS_FAILED
        )
        assert done.status == upload_pb2.UPLOAD_STATUS_COMPLETED, done.failure_reason
        assert done.final_checksum == sha256(data)
        assert await cluster.blobs.read(content_key(done.file_id, upload_id)) == data

    engine = create_engine(cluster.settings.database_url)
    try:
        async with session_factory(engine)() as session:
            uploads = list((await session.execute(select(UploadRow))).scalars())
            assert {u.id for u in uploads} == set(sources)
            assert all(u.status == COMPLETED and u.file_version == 1 for u in uploads)
            # Invariant 2: the count is exactly the distinct stored chunks.
            per_upload = dict(
                (
                    await session.execute(
                        select(
                            ChunkRow.upload_id, func.count(func.distinct(ChunkRow.chunk_index))
                        ).group_by(ChunkRow.upload_id)
                    )
                ).all()
            )
            assert all(
                per_upload[u.id] == u.received_chunk_count == u.total_chunks for u in uploads
            )
            # One file per upload, each at version 1: merged exactly once.
            files = list(
                (await session.execute(select(FileRow).where(FileRow.kind == "file"))).scalars()
            )
            assert len(files) == UPLOADS and all(f.version == 1 for f in files)
            # Exactly one content event per upload (invariant 6: version + event together).
            rows = (
                await session.execute(
                    select(outbox_events.c.event).where(
                        outbox_events.c.event_type == "file.content.updated"
                    )
                )
            ).scalars()
            events = [events_pb2.Event.FromString(r) for r in rows]
            per = sorted(e.file_content_updated.upload_id for e in events)
            assert per == sorted(sources)
            assert all(e.version == 1 and e.audience_user_ids == ["alice"] for e in events)
    finally:
        await engine.dispose()
