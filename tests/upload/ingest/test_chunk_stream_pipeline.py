"""UploadChunks overlaps neighbouring chunks (the next one is checked, hashed and staged
while one commits) and still answers exactly as sequential PutChunk calls would.

Not timing-based: chunk 0's publish (inside its commit) waits on a gate only the test
opens, after it has seen the next chunk staged or refused.
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
from upload.upload_helpers import (
    CallerContext,
    chunk_request,
    chunk_store_over,
    create_request,
    split,
)

from services.common.auth import Identity
from services.upload.errors import ChecksumMismatch, ChunkConflict
from services.upload.servicer import UploadServicer
from services.upload.storage.blob_store import LocalBlobStore, chunk_key

CHUNK = 1024
GATE_TIMEOUT_S = 20.0


class PublishGate(LocalBlobStore):
    """A local blob store whose publish of one key parks until the gate opens (then fails
    with `fail`, if set); reports every key it stages."""

    def __init__(self, inner: LocalBlobStore, gated_key: str, fail: Exception | None = None):
        super().__init__(inner.root)
        self._gated_key = gated_key
        self._fail = fail
        self._loop = asyncio.get_running_loop()
        self.parked = asyncio.Event()
        self.gate = threading.Event()
        self.staged: asyncio.Queue[str] = asyncio.Queue()

    def stage_checked_sync(
        self, key: str, data: bytes, algorithm: str, expected: str
    ) -> tuple[str | None, str]:
        staged = super().stage_checked_sync(key, data, algorithm, expected)
        self._loop.call_soon_threadsafe(self.staged.put_nowait, key)
        return staged

    def _publish_many_sync(self, items) -> None:
        if any(key == self._gated_key for _, key in items):
            self._loop.call_soon_threadsafe(self.parked.set)
            if not self.gate.wait(GATE_TIMEOUT_S):
                raise RuntimeError("gate never opened")
            if self._fail is not None:
                raise self._fail
        super()._publish_many_sync(items)


def _alice(parts) -> Identity:
    return parts.auth.require_user(CallerContext())


async def _gated(parts, chunks: int, fail: Exception | None = None):
    data = os.urandom(CHUNK * chunks)
    upload = await parts.uploads.create(_alice(parts), create_request(data, CHUNK, name="pipe.bin"))
    blobs = PublishGate(parts.blobs, chunk_key(upload.id, 0), fail)
    store = chunk_store_over(parts, blobs)
    servicer = UploadServicer(parts.auth, parts.uploads, store)
    return upload, split(data, CHUNK), blobs, servicer


def _call(servicer: UploadServicer, requests: list) -> asyncio.Task:
    async def stream():
        for request in requests:
            yield request

    return asyncio.create_task(servicer.UploadChunks(stream(), CallerContext()))  # type: ignore[arg-type]


async def _staged(blobs: PublishGate, key: str) -> None:
    async with asyncio.timeout(GATE_TIMEOUT_S):
        while await blobs.staged.get() != key:
            pass


async def _staged_during_first_commit(blobs: PublishGate, key: str) -> None:
    """The first chunk is parked in its commit; `key` is then staged twice (it and a repeat)."""
    async with asyncio.timeout(GATE_TIMEOUT_S):
        await blobs.parked.wait()
    await _staged(blobs, key)
    await _staged(blobs, key)


def _files(parts, upload_id: str) -> list[str]:
    return sorted(p.name for p in (parts.settings.blob_root / "uploads" / upload_id).iterdir())


async def test_the_next_chunk_is_staged_while_one_commits(parts) -> None:
    upload, chunks, blobs, servicer = await _gated(parts, 3)
    call = _call(servicer, [chunk_request(upload.id, i, chunks[i]) for i in range(3)])
    try:
        async with asyncio.timeout(GATE_TIMEOUT_S):
            await blobs.parked.wait()
        # Chunk 0 is inside its commit; chunk 1 is staged meanwhile, and not yet counted.
        await _staged(blobs, chunk_key(upload.id, 1))
        assert not call.done()
        stored, _ = await parts.uploads.get(_alice(parts), upload.id)
        assert stored.received_chunk_count == 0
    finally:
        blobs.gate.set()
    response = await call
    assert [(c.chunk_index, c.duplicate, c.received_chunk_count) for c in response.chunks] == [
        (0, False, 1),
        (1, False, 2),
        (2, False, 3),
    ]
    assert response.upload.received_chunk_count == 3
    assert _files(parts, upload.id) == ["0", "1", "2"]


async def test_a_repeat_prepared_during_the_first_commit_is_the_duplicate(parts) -> None:
    upload, chunks, blobs, servicer = await _gated(parts, 2)
    again = chunk_request(upload.id, 0, chunks[0])
    call = _call(servicer, [chunk_request(upload.id, 0, chunks[0]), again, again])
    try:
        # The repeat found no row yet (chunk 0 is still committing) and staged its bytes.
        await _staged_during_first_commit(blobs, chunk_key(upload.id, 0))
    finally:
        blobs.gate.set()
    response = await call
    assert [(c.chunk_index, c.duplicate, c.received_chunk_count) for c in response.chunks] == [
        (0, False, 1),
        (0, True, 1),
        (0, True, 1),
    ]
    assert (parts.settings.blob_root / chunk_key(upload.id, 0)).read_bytes() == chunks[0]
    assert _files(parts, upload.id) == ["0"]  # the staged repeat removed


async def test_a_conflicting_repeat_prepared_during_the_first_commit(parts) -> None:
    upload, chunks, blobs, servicer = await _gated(parts, 2)
    other = chunk_request(upload.id, 0, os.urandom(CHUNK))
    call = _call(servicer, [chunk_request(upload.id, 0, chunks[0]), other])
    try:
        await _staged_during_first_commit(blobs, chunk_key(upload.id, 0))
    finally:
        blobs.gate.set()
    with pytest.raises(ChunkConflict):
        await call
    stored, _ = await parts.uploads.get(_alice(parts), upload.id)
    assert stored.received_chunk_count == 1
    assert (parts.settings.blob_root / chunk_key(upload.id, 0)).read_bytes() == chunks[0]
    assert _files(parts, upload.id) == ["0"]


async def test_a_later_chunks_error_comes_after_the_earlier_commit(parts) -> None:
    upload, chunks, blobs, servicer = await _gated(parts, 3)
    refused = asyncio.Event()
    prepare = servicer._chunks.prepare

    async def observed(*args, **kwargs):
        try:
            return await prepare(*args, **kwargs)
        except ChecksumMismatch:
            refused.set()
            raise

    servicer._chunks.prepare = observed  # type: ignore[method-assign]
    bad = chunk_request(upload.id, 1, chunks[1])
    bad.checksum = "0" * 64
    call = _call(servicer, [chunk_request(upload.id, 0, chunks[0]), bad])
    try:
        async with asyncio.timeout(GATE_TIMEOUT_S):
            await blobs.parked.wait()
            # Chunk 1 is refused while chunk 0 commits: the call waits for chunk 0 first.
            await refused.wait()
        assert not call.done()
    finally:
        blobs.gate.set()
    with pytest.raises(ChecksumMismatch):
        await call
    stored, _ = await parts.uploads.get(_alice(parts), upload.id)
    assert stored.received_chunk_count == 1
    assert _files(parts, upload.id) == ["0"]


async def test_an_earlier_commit_failure_removes_the_next_staged_chunk(parts) -> None:
    upload, chunks, blobs, servicer = await _gated(parts, 3, fail=OSError("publish failed"))
    call = _call(servicer, [chunk_request(upload.id, i, chunks[i]) for i in range(3)])
    try:
        async with asyncio.timeout(GATE_TIMEOUT_S):
            await blobs.parked.wait()
        await _staged(blobs, chunk_key(upload.id, 1))
    finally:
        blobs.gate.set()
    with pytest.raises(OSError, match="publish failed"):
        await call
    stored, _ = await parts.uploads.get(_alice(parts), upload.id)
    assert stored.received_chunk_count == 0  # chunk 0's row rolled back, chunk 1 never committed
    assert _files(parts, upload.id) == []  # both staged files removed
