"""Chunk objects read ahead for the S3 merge: up to `window` GETs in flight, handed out in
index order, each checked for size before its body is read."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

import obstore
from obstore import Bytes
from obstore.store import S3Store

import merge_core
from services.upload.errors import BlobStoreUnavailable
from services.upload.storage.blob_store.base import ChunkRef
from services.upload.storage.blob_store.s3_errors import store_errors


def _size_mismatch(chunk: ChunkRef, actual: int) -> merge_core.ChunkSizeMismatch:
    """merge_core's exception for a chunk object of the wrong size, attributes set."""
    err = merge_core.ChunkSizeMismatch(
        f"chunk {chunk.index} ({chunk.key}): size mismatch: expected {chunk.size} bytes, "
        f"got {actual}"
    )
    err.index, err.path, err.expected, err.actual = chunk.index, chunk.key, chunk.size, actual
    return err


class ReadAhead:
    """Reads chunk objects with up to `window` GETs in flight, handed out in index order,
    so the next chunks' reads overlap hashing and uploading this one. Memory: `window`
    whole chunks (each at most max_chunk_size) plus the one being consumed."""

    def __init__(self, store: S3Store, chunks: Sequence[ChunkRef], window: int) -> None:
        self._store = store
        self._chunks = iter(chunks)
        self._window = max(1, window)
        self._pending: deque[asyncio.Task[Bytes]] = deque()

    async def __aenter__(self) -> ReadAhead:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._pending:
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)

    def _fill(self) -> None:
        while len(self._pending) < self._window:
            chunk = next(self._chunks, None)
            if chunk is None:
                return
            self._pending.append(asyncio.create_task(self._get(chunk)))

    async def _get(self, chunk: ChunkRef) -> Bytes:
        with store_errors("get", chunk.key):
            try:
                result = await obstore.get_async(self._store, chunk.key)
                stored = int(result.meta["size"])
                if stored != chunk.size:
                    # Checked before reading the body: an oversized object must not be
                    # pulled into memory (merge_core's file merge checks sizes first too).
                    raise _size_mismatch(chunk, stored)
                return await result.bytes_async()
            except FileNotFoundError as missing:
                raise BlobStoreUnavailable(
                    f"chunk {chunk.index} object {chunk.key!r} is missing",
                    operation="get",
                    key=chunk.key,
                ) from missing

    async def next(self) -> Bytes:
        """The next chunk's bytes (raises the error reading it)."""
        self._fill()
        data = await self._pending.popleft()
        self._fill()
        return data
