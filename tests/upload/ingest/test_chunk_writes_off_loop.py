"""Chunk blob writes run off the event loop: while one chunk's write is stuck in the blob
store, other chunks (of the same upload and of another) are stored and reads answer.

Not timing-based: the stuck write waits on a gate only the test opens, after the other
calls have finished. Were the write on the event loop, nothing else could run until the
gate's own timeout, and the stuck call would fail with "gate never opened".
"""

from __future__ import annotations

import asyncio
import os
import threading

from upload.upload_helpers import (
    CallerContext,
    chunk_request,
    chunk_store_over,
    create_request,
    sha256,
    split,
)

from services.common.auth import Identity
from services.upload.servicer import UploadServicer
from services.upload.storage.blob_store import LocalBlobStore, chunk_key

CHUNK = 1024
GATE_TIMEOUT_S = 20.0


class GatedBlobs(LocalBlobStore):
    """A local blob store whose write of one key blocks its thread until the gate opens."""

    def __init__(self, inner: LocalBlobStore, gated_key: str) -> None:
        super().__init__(inner.root)
        self._gated_key = gated_key
        self._loop = asyncio.get_running_loop()
        self.entered = asyncio.Event()
        self.gate = threading.Event()

    def stage_checked_sync(
        self, key: str, data: bytes, algorithm: str, expected: str
    ) -> tuple[str | None, str]:
        if key == self._gated_key:
            self._loop.call_soon_threadsafe(self.entered.set)
            if not self.gate.wait(GATE_TIMEOUT_S):
                raise RuntimeError("gate never opened: the event loop was blocked")
        return super().stage_checked_sync(key, data, algorithm, expected)


async def test_other_chunks_and_reads_proceed_while_a_blob_write_blocks(parts) -> None:
    alice = Identity(tenant_id="t-offloop", user_id="alice")
    data = os.urandom(CHUNK * 2)
    other = os.urandom(CHUNK)
    slow = await parts.uploads.create(alice, create_request(data, CHUNK, name="slow.bin"))
    fast = await parts.uploads.create(alice, create_request(other, CHUNK, name="fast.bin"))
    blobs = GatedBlobs(parts.blobs, chunk_key(slow.id, 0))
    store = chunk_store_over(parts, blobs)
    chunks = split(data, CHUNK)
    stuck = asyncio.create_task(store.put(alice, slow.id, 0, chunks[0], sha256(chunks[0])))
    try:
        await asyncio.wait_for(blobs.entered.wait(), GATE_TIMEOUT_S)
        # Another upload's chunk, the same upload's other chunk, and a read: all answer
        # while chunk 0's write is parked in its thread.
        stored = await store.put(alice, fast.id, 0, other, sha256(other))
        assert (stored.duplicate, stored.started_merge) == (False, True)
        sibling = await store.put(alice, slow.id, 1, chunks[1], sha256(chunks[1]))
        assert (sibling.duplicate, sibling.upload.received_chunk_count) == (False, 1)
        upload, missing = await parts.uploads.get(alice, slow.id)
        assert (upload.status, upload.received_chunk_count) == ("uploading", 1)
        assert missing
        assert not stuck.done()
    finally:
        blobs.gate.set()
    outcome = await stuck
    # The stuck chunk completes the set: counted once, and it alone starts the merge.
    assert (outcome.duplicate, outcome.started_merge) == (False, True)
    assert outcome.upload.received_chunk_count == 2
    assert outcome.upload.status == "merging"
    assert (parts.settings.blob_root / chunk_key(slow.id, 0)).read_bytes() == chunks[0]
    # No staged temp file is left behind.
    assert sorted(p.name for p in (parts.settings.blob_root / "uploads" / slow.id).iterdir()) == [
        "0",
        "1",
    ]


async def test_upload_chunks_receives_the_next_chunk_while_storing_one(parts) -> None:
    alice = parts.auth.require_user(CallerContext())  # type: ignore[arg-type]
    data = os.urandom(CHUNK * 3)
    chunks = split(data, CHUNK)
    upload = await parts.uploads.create(alice, create_request(data, CHUNK, name="pipe.bin"))
    blobs = GatedBlobs(parts.blobs, chunk_key(upload.id, 0))
    store = chunk_store_over(parts, blobs)
    servicer = UploadServicer(parts.auth, parts.uploads, store)
    second_pulled = asyncio.Event()

    async def stream():
        yield chunk_request(upload.id, 0, chunks[0])
        second_pulled.set()
        for i in (1, 1, 2):  # 1 twice: the second is the duplicate, as with PutChunk
            yield chunk_request(upload.id, i, chunks[i])

    call = asyncio.create_task(servicer.UploadChunks(stream(), CallerContext()))  # type: ignore[arg-type]
    try:
        await asyncio.wait_for(blobs.entered.wait(), GATE_TIMEOUT_S)
        # Chunk 0 is parked in its write, and the stream is already asked for chunk 1.
        await asyncio.wait_for(second_pulled.wait(), GATE_TIMEOUT_S)
        assert not call.done()
    finally:
        blobs.gate.set()
    response = await call
    assert [(c.chunk_index, c.duplicate) for c in response.chunks] == [
        (0, False),
        (1, False),
        (1, True),
        (2, False),
    ]
    assert response.upload.received_chunk_count == 3
