"""Group commit: concurrent chunks (of several uploads) waiting to be recorded share ONE
transaction; each caller is answered only once that transaction committed; a batch that
fails fails exactly its own chunks (nothing recorded, staged bytes removed) and a retry
stores them; an upload that stops accepting chunks fails only its own chunks of a batch.

Not timing-based: the first batch parks inside its transaction (its publish waits on a
gate only the test opens) until the test has seen the other chunks queued behind it.
SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections import deque

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select
from upload.upload_helpers import chunk_store_over, create_request, sha256, split

from services.common.auth import Identity
from services.common.db import create_engine, read_only, session_factory
from services.upload.errors import UploadNotActive
from services.upload.models import ChunkRow, UploadRow
from services.upload.storage.blob_store import LocalBlobStore, chunk_key

CHUNK = 1024
GATE_TIMEOUT_S = 20.0
ALICE = Identity(tenant_id="t-group", user_id="alice")


class Gates(LocalBlobStore):
    """A local store that parks the publish containing `publish_key` and the stage of
    `stage_key` until their gates open, records the keys of every publish (one per batch),
    and fails a publish containing a key of `fail_upload`."""

    def __init__(self, inner: LocalBlobStore, publish_key: str, stage_key: str = "") -> None:
        super().__init__(inner.root)
        self._loop = asyncio.get_running_loop()
        self.publish_key, self.stage_key = publish_key, stage_key
        self.fail_upload = ""
        self.parked, self.stage_parked = asyncio.Event(), asyncio.Event()
        self.publish_gate, self.stage_gate = threading.Event(), threading.Event()
        self.batches: list[list[str]] = []

    def stage_checked_sync(
        self, key: str, data: bytes, algorithm: str, expected: str
    ) -> tuple[str | None, str]:
        if key == self.stage_key:
            self._loop.call_soon_threadsafe(self.stage_parked.set)
            if not self.stage_gate.wait(GATE_TIMEOUT_S):
                raise RuntimeError("stage gate never opened")
        return super().stage_checked_sync(key, data, algorithm, expected)

    def _publish_many_sync(self, items) -> None:
        keys = [key for _, key in items]
        self.batches.append(keys)
        if self.publish_key in keys:
            self._loop.call_soon_threadsafe(self.parked.set)
            if not self.publish_gate.wait(GATE_TIMEOUT_S):
                raise RuntimeError("publish gate never opened")
        if self.fail_upload and any(f"/{self.fail_upload}/" in k for k in keys):
            raise OSError(errno.ENOSPC, "No space left on device")
        super()._publish_many_sync(items)


async def _uploads(parts, count: int) -> list[tuple[object, list[bytes]]]:
    made = []
    for n in range(count):
        data = os.urandom(CHUNK * 2)
        upload = await parts.uploads.create(ALICE, create_request(data, CHUNK, name=f"g{n}.bin"))
        made.append((upload, split(data, CHUNK)))
    return made


def _put(store, upload, chunks: list[bytes], index: int) -> asyncio.Task:
    return asyncio.create_task(
        store.put(ALICE, upload.id, index, chunks[index], sha256(chunks[index]))
    )


class _Queue(deque):
    """The committer's queue, telling the test when it holds `count` chunks."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count
        self.full = asyncio.Event()

    def append(self, item) -> None:
        super().append(item)
        if len(self) >= self.count:
            self.full.set()


def _watch_queue(store, count: int) -> _Queue:
    """Replace the (empty) committer queue with one that signals at `count` chunks."""
    assert not store._committer._queue
    store._committer._queue = queue = _Queue(count)
    return queue


async def _full(queue: _Queue) -> None:
    async with asyncio.timeout(GATE_TIMEOUT_S):
        await queue.full.wait()


async def _row(database_url: str, upload_id: str, index: int) -> tuple[str, int] | None:
    """The chunk's row as another connection (a fresh engine) sees it: committed."""
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            await read_only(session)  # a snapshot: no wait on a SQLite writer
            row = (
                await session.execute(
                    select(ChunkRow.checksum, ChunkRow.size).where(
                        ChunkRow.upload_id == upload_id, ChunkRow.chunk_index == index
                    )
                )
            ).first()
            return None if row is None else (row[0], row[1])
    finally:
        await engine.dispose()


async def _received(parts, upload_id: str) -> int:
    async with parts.sessions() as session:
        return (await session.get(UploadRow, upload_id)).received_chunk_count


def _batches_observed() -> float:
    return REGISTRY.get_sample_value("serentak_upload_chunk_commit_batch_chunks_count") or 0.0


def _files(parts, upload_id: str) -> list[str]:
    folder = parts.settings.blob_root / "uploads" / upload_id
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


async def test_concurrent_chunks_of_several_uploads_share_one_commit(parts) -> None:
    made = await _uploads(parts, 4)
    (a, a_chunks), others = made[0], made[1:]
    blobs = Gates(parts.blobs, chunk_key(a.id, 0))
    store = chunk_store_over(parts, blobs)
    batches = _batches_observed()
    queue = _watch_queue(store, len(others) + 1)
    first = _put(store, a, a_chunks, 0)
    try:
        async with asyncio.timeout(GATE_TIMEOUT_S):
            await blobs.parked.wait()  # the first batch is inside its transaction
        waiting = [_put(store, u, c, 0) for u, c in others] + [_put(store, a, a_chunks, 1)]
        await _full(queue)
        # Queued, not recorded: nobody is answered and no other connection sees a row.
        assert not any(t.done() for t in waiting)
        for upload, _ in others:
            assert await _row(parts.settings.database_url, upload.id, 0) is None
    finally:
        blobs.publish_gate.set()
    assert (await first).upload.received_chunk_count == 1
    # Each answer comes only once its row (seen from another connection) and bytes are durable.
    for done in asyncio.as_completed(waiting):
        outcome = await done
        assert not outcome.duplicate
        upload_id, index = outcome.upload.id, outcome.index
        chunks = next(c for u, c in made if u.id == upload_id)
        stored = await _row(parts.settings.database_url, upload_id, index)
        assert stored == (sha256(chunks[index]), CHUNK)
        assert (parts.settings.blob_root / chunk_key(upload_id, index)).read_bytes() == chunks[
            index
        ]
    # Two transactions: A's first chunk, then the four others together (one publish).
    assert len(blobs.batches) == 2
    assert sorted(blobs.batches[1]) == sorted(
        [chunk_key(u.id, 0) for u, _ in others] + [chunk_key(a.id, 1)]
    )
    assert _batches_observed() - batches == 2
    # A's second chunk completed its set in that shared commit: counted once, merge started.
    last = await waiting[-1]
    assert (last.started_merge, last.upload.received_chunk_count, last.upload.status) == (
        True,
        2,
        "merging",
    )
    for upload, _ in others:
        assert await _received(parts, upload.id) == 1
        assert _files(parts, upload.id) == ["0"]  # no staged temp file left


async def test_a_failed_batch_fails_only_its_own_chunks_and_a_retry_stores_them(parts) -> None:
    made = await _uploads(parts, 4)
    (a, a_chunks), others = made[0], made[1:]
    blobs = Gates(parts.blobs, chunk_key(a.id, 0))
    blobs.fail_upload = others[1][0].id  # the shared batch holds one of its chunks
    store = chunk_store_over(parts, blobs)
    queue = _watch_queue(store, len(others))
    first = _put(store, a, a_chunks, 0)
    try:
        async with asyncio.timeout(GATE_TIMEOUT_S):
            await blobs.parked.wait()
        waiting = [_put(store, u, c, 0) for u, c in others]
        await _full(queue)
    finally:
        blobs.publish_gate.set()
    assert not (await first).duplicate  # the batch before is untouched
    results = await asyncio.gather(*waiting, return_exceptions=True)
    # Every chunk of the failed batch gets its error; none of them is recorded or left staged.
    assert all(isinstance(r, OSError) and r.errno == errno.ENOSPC for r in results), results
    for upload, _ in others:
        assert await _row(parts.settings.database_url, upload.id, 0) is None
        assert await _received(parts, upload.id) == 0
        assert not [f for f in _files(parts, upload.id) if f.endswith(".tmp")]
    # The store recovers: the same sends again are stored (not duplicates), counted once.
    blobs.fail_upload = ""
    again = await asyncio.gather(*(_put(store, u, c, 0) for u, c in others))
    assert [(o.duplicate, o.upload.received_chunk_count) for o in again] == [(False, 1)] * 3
    for upload, chunks in others:
        assert await _row(parts.settings.database_url, upload.id, 0) == (sha256(chunks[0]), CHUNK)
        assert _files(parts, upload.id) == ["0"]


async def test_an_upload_stopped_meanwhile_fails_only_its_chunks_of_the_batch(parts) -> None:
    made = await _uploads(parts, 3)
    (a, a_chunks), (b, b_chunks), (c, c_chunks) = made
    blobs = Gates(parts.blobs, chunk_key(a.id, 0), stage_key=chunk_key(b.id, 0))
    store = chunk_store_over(parts, blobs)
    queue = _watch_queue(store, 2)
    # B's chunk passed its checks and is staging when B is aborted.
    b_put = _put(store, b, b_chunks, 0)
    try:
        async with asyncio.timeout(GATE_TIMEOUT_S):
            await blobs.stage_parked.wait()
        await parts.uploads.abort(ALICE, b.id)
        first = _put(store, a, a_chunks, 0)
        async with asyncio.timeout(GATE_TIMEOUT_S):
            await blobs.parked.wait()
        blobs.stage_gate.set()
        c_put = _put(store, c, c_chunks, 0)
        await _full(queue)  # B's and C's chunks, behind A's batch
    finally:
        blobs.stage_gate.set()
        blobs.publish_gate.set()
    await first
    with pytest.raises(UploadNotActive):
        await b_put
    stored = await c_put  # same batch, other upload: recorded
    assert (stored.duplicate, stored.upload.received_chunk_count) == (False, 1)
    assert sorted(blobs.batches[1]) == sorted([chunk_key(b.id, 0), chunk_key(c.id, 0)])
    assert await _row(parts.settings.database_url, b.id, 0) is None
    assert await _received(parts, b.id) == 0
    assert await _row(parts.settings.database_url, c.id, 0) == (sha256(c_chunks[0]), CHUNK)


async def test_a_shutdown_at_any_moment_of_a_drain_returns_its_connection(parts) -> None:
    # The service's shutdown cancels the flusher wherever it is, also while it hands its
    # connection back after the last batch; when `close` returns the connection is back in
    # the pool (the service disposes of the pool next: one still out was only reclaimed,
    # with a warning, by the garbage collector).
    pool = parts.engine.pool
    (upload, chunks), *_ = await _uploads(parts, 1)
    warm = chunk_store_over(parts, parts.blobs)
    await _put(warm, upload, chunks, 0)
    await warm.close()
    before = pool.checkedout()  # the chunk reader's own connection, kept open
    for turns in range(16):
        (upload, chunks), *_ = await _uploads(parts, 1)
        store = chunk_store_over(parts, parts.blobs)
        await _put(store, upload, chunks, 0)
        for _ in range(turns):  # the flusher's remaining steps, one loop turn each
            await asyncio.sleep(0)
        await store.close()
        assert pool.checkedout() == before, f"a connection left checked out ({turns} turns)"
