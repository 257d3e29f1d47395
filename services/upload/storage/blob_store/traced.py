"""A blob store whose byte-moving calls are spans, when tracing is on.

`traced(store)` wraps any backend: writes (`blob write`: `put`, `stage`, `stage_checked`),
publishes (`blob publish`), merges (`blob merge`), copies (`blob copy`) and reads
(`blob read`) each get a span with the key (and the byte count); the rest (existence,
listing, deletes, sweeps) passes straight through. With tracing off the store is
returned as it is: no wrapper, no cost.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import datetime

from services.common import tracing
from services.upload.storage.blob_store.base import BlobStore, ChunkRef, Merged, StoredObject


def traced(store: BlobStore) -> BlobStore:
    """`store` with spans around its byte-moving calls, or `store` itself when off."""
    return TracedBlobStore(store) if tracing.enabled() else store


class TracedBlobStore:
    """Delegates every call to `inner`; see the module docstring for the spans."""

    def __init__(self, inner: BlobStore) -> None:
        self.inner = inner
        self._backend = type(inner).__name__

    async def put(self, key: str, data: bytes) -> None:
        """See `BlobStore.put`."""
        with tracing.span("blob write", backend=self._backend, key=key, bytes=len(data)):
            await self.inner.put(key, data)

    async def stage(self, key: str, data: bytes) -> object:
        """See `BlobStore.stage`."""
        with tracing.span("blob write", backend=self._backend, key=key, bytes=len(data)):
            return await self.inner.stage(key, data)

    async def stage_checked(
        self, key: str, data: bytes, algorithm: str, expected: str
    ) -> tuple[object | None, str]:
        """See `BlobStore.stage_checked`."""
        with tracing.span("blob write", backend=self._backend, key=key, bytes=len(data)):
            return await self.inner.stage_checked(key, data, algorithm, expected)

    async def publish(self, staged: object, key: str) -> None:
        """See `BlobStore.publish`."""
        with tracing.span("blob publish", backend=self._backend, key=key, objects=1):
            await self.inner.publish(staged, key)

    async def publish_many(self, items: Sequence[tuple[object, str]]) -> None:
        """See `BlobStore.publish_many`."""
        with tracing.span("blob publish", backend=self._backend, objects=len(items)):
            await self.inner.publish_many(items)

    async def discard(self, staged: object) -> None:
        """See `BlobStore.discard`."""
        await self.inner.discard(staged)

    async def exists(self, key: str) -> bool:
        """See `BlobStore.exists`."""
        return await self.inner.exists(key)

    async def size(self, key: str) -> int:
        """See `BlobStore.size`."""
        return await self.inner.size(key)

    async def read(self, key: str, offset: int = 0, length: int = -1) -> bytes:
        """See `BlobStore.read`."""
        with tracing.span("blob read", backend=self._backend, key=key, offset=offset):
            return await self.inner.read(key, offset, length)

    def iter_read(self, key: str, offset: int, block: int) -> AsyncIterator[bytes]:
        """See `BlobStore.iter_read`."""
        return self.inner.iter_read(key, offset, block)

    async def copy(self, source: str, key: str) -> None:
        """See `BlobStore.copy`."""
        with tracing.span("blob copy", backend=self._backend, key=key):
            await self.inner.copy(source, key)

    async def delete(self, key: str) -> None:
        """See `BlobStore.delete`."""
        await self.inner.delete(key)

    async def delete_prefix(self, prefix: str) -> int:
        """See `BlobStore.delete_prefix`."""
        return await self.inner.delete_prefix(prefix)

    def list_objects(self, prefix: str) -> AsyncIterator[StoredObject]:
        """See `BlobStore.list_objects`."""
        return self.inner.list_objects(prefix)

    async def merge(
        self,
        chunks: Sequence[ChunkRef],
        key: str,
        algorithm: str,
        expected_checksum: str | None,
    ) -> Merged:
        """See `BlobStore.merge`."""
        with tracing.span(
            "blob merge",
            backend=self._backend,
            key=key,
            chunks=len(chunks),
            bytes=sum(c.size for c in chunks),
        ):
            return await self.inner.merge(chunks, key, algorithm, expected_checksum)

    async def abort_unfinished(self, before: datetime) -> int:
        """See `BlobStore.abort_unfinished`."""
        return await self.inner.abort_unfinished(before)

    async def checksum(self, key: str, algorithm: str) -> str:
        """See `BlobStore.checksum`."""
        return await self.inner.checksum(key, algorithm)

    async def close(self) -> None:
        """See `BlobStore.close`."""
        await self.inner.close()
