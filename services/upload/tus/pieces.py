"""Cutting a tus byte stream into Serentak's fixed-size chunks ("pieces").

A tus upload of length L with chunk size C is pieces 0..N-1 (N = max(1, ceil(L / C))),
every one C bytes but the last. Bytes arrive at any offset a client resumes from; the
writer keeps the current piece's bytes in memory while a request streams, hands each
piece the moment it is whole to its sink (a `ChunkStore.put`: hashed, staged, fsynced,
recorded exactly once; or a parked blob for uploads that have no Serentak upload yet),
and when the request ends (finished, cut, refused) writes the incomplete piece's bytes
to the durable tail (tails.py). So the offset a server reports, stored pieces times C
plus the tail, is always bytes on disk, and a client resumes at any byte, inside a chunk
too; nothing is written twice on the common path (a piece that fits in one request never
touches the tail).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.auth import Identity
from services.upload import checksums
from services.upload.ingest.chunks import ChunkOutcome, ChunkStore
from services.upload.ingest.uploads import MergeClaimer
from services.upload.models import TusUploadRow
from services.upload.storage.blob_store import BlobStore
from services.upload.tus.protocol import TusError
from services.upload.tus.tails import Tails

# Awaited before each piece a request stores after its first (the rate limit's unit).
Charge = Callable[[], Awaitable[None]]


def parked_prefix(tus_id: str) -> str:
    """Where an upload without a Serentak upload keeps its pieces."""
    return f"tus/{tus_id}"


def parked_key(tus_id: str, index: int) -> str:
    """The blob key of one parked piece."""
    return f"{parked_prefix(tus_id)}/{index}"


@dataclass(frozen=True, slots=True)
class Layout:
    """An upload's pieces: chunk size and length (None while deferred)."""

    chunk_size: int
    length: int | None

    def count(self) -> int | None:
        """How many pieces the upload has (None while its length is deferred)."""
        if self.length is None:
            return None
        return max(1, -(-self.length // self.chunk_size))

    def piece_size(self, index: int) -> int:
        """Bytes piece `index` holds: the chunk size, the remainder for the last one."""
        if self.length is None:
            return self.chunk_size
        return max(0, min(self.chunk_size, self.length - index * self.chunk_size))


class PieceSink(Protocol):
    """Where whole pieces go."""

    async def store(self, index: int, data: bytes) -> None:
        """Store piece `index` durably (a retry of a stored piece is a no-op)."""
        ...


class ChunkSink:
    """Pieces as chunks of a Serentak upload, through the upload service's own use case
    (`ChunkStore.put`): the same checks, group commit, exactly-once merge start."""

    def __init__(
        self,
        chunks: ChunkStore,
        identity: Identity,
        upload_id: str,
        algorithm: str,
        claim: MergeClaimer | None,
        finish: Callable[[ChunkOutcome], Awaitable[None]],
    ) -> None:
        self._chunks = chunks
        self._identity = identity
        self._upload_id = upload_id
        self._algorithm = algorithm
        self._claim = claim
        self._finish = finish

    async def store(self, index: int, data: bytes) -> None:
        """Put chunk `index`; the chunk that completes the upload starts its merge."""
        digest = await checksums.digest_async(data, self._algorithm)
        outcome = await self._chunks.put(
            self._identity, self._upload_id, index, data, digest, claim=self._claim
        )
        await self._finish(outcome)


class ParkedSink:
    """Pieces of an upload with no Serentak upload yet, as blobs `tus/{id}/{index}`;
    `tus_uploads.pieces` counts them (a conditional update: one counter move per piece)."""

    def __init__(
        self, blobs: BlobStore, sessions: async_sessionmaker[AsyncSession], tus_id: str
    ) -> None:
        self._blobs = blobs
        self._sessions = sessions
        self._tus_id = tus_id

    async def store(self, index: int, data: bytes) -> None:
        """Publish the piece, then count it."""
        key = parked_key(self._tus_id, index)
        staged = await self._blobs.stage(key, data)
        try:
            await self._blobs.publish(staged, key)
        finally:
            await asyncio.shield(self._blobs.discard(staged))
        async with self._sessions.begin() as session:
            await session.execute(
                update(TusUploadRow)
                .where(TusUploadRow.id == self._tus_id, TusUploadRow.pieces == index)
                .values(pieces=index + 1)
            )


async def write_pieces(
    tails: Tails,
    tus_id: str,
    layout: Layout,
    sink: PieceSink,
    start: int,
    blocks: AsyncIterator[bytes],
    charge: Charge | None = None,
) -> int:
    """Apply `blocks` at byte `start` (the upload's durable offset); returns the new one.

    Whole pieces go to `sink`; the incomplete piece's bytes go to the tail when the
    request ends, however it ends (an error from `blocks`, a cut connection, is re-raised
    after that). A piece the sink failed to store is not kept: the client resends it.
    """
    index, have = divmod(start, layout.chunk_size)
    buffer = bytearray()
    if have:
        buffer += await tails.read(tus_id, index)
        if len(buffer) != have:
            raise TusError(409, "OFFSET_MISMATCH", "the staged bytes changed; HEAD again")
    on_disk = have
    first = index
    stored = 0

    async def store(data: bytes) -> None:
        nonlocal stored
        if stored and charge is not None:
            await charge()
        await sink.store(index, data)
        stored += 1

    try:
        async for block in blocks:
            view = memoryview(block)
            while len(view):
                room = layout.piece_size(index) - len(buffer)
                if room <= 0:
                    raise TusError(413, "UPLOAD_LENGTH_EXCEEDED", "bytes past Upload-Length")
                buffer += view[:room]
                view = view[room:]
                if len(buffer) == layout.piece_size(index):
                    await store(bytes(buffer))
                    index += 1
                    buffer.clear()
                    on_disk = 0
        count = layout.count()
        # A deferred length just set, or an empty upload: the last piece may be whole already.
        if count is not None and index < count and len(buffer) == layout.piece_size(index):
            await store(bytes(buffer))
            index += 1
            buffer.clear()
            on_disk = 0
    finally:
        keep = 0 < len(buffer) < layout.piece_size(index) and len(buffer) != on_disk
        await asyncio.shield(_persist(tails, tus_id, index, bytes(buffer) if keep else None, first))
    # Here the buffer is an incomplete piece: just written to the tail, or the tail as read.
    return index * layout.chunk_size + len(buffer)


async def _persist(tails: Tails, tus_id: str, index: int, tail: bytes | None, first: int) -> None:
    """Write the incomplete piece's tail, then drop the tails of pieces now stored."""
    if tail is not None:
        await tails.write(tus_id, index, tail)
    if index > first:
        await tails.remove(tus_id, below=index)
