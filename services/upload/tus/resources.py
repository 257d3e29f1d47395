"""tus upload resources: create, read the durable offset, write, terminate, concatenate,
sweep. HTTP-free; `http.py` calls these under the upload's request lock.

Every tus upload that makes a file is a Serentak upload made by the upload service's own
use cases: `Uploads.prepare` / `insert` (target rights, name, size limit, the user's
open-upload cap and the tenant quota, in the transaction that also stores the tus row),
and `ChunkStore.put` for its chunks (so the exactly-once merge start, the merge job, the
file lock and fencing check, the new version and its outbox event are those of gRPC).
A partial upload (concatenation) or one whose length is deferred has no Serentak upload
yet: its pieces are parked in the blob store and fed through the same `ChunkStore.put`
once its final upload (or its length) says what file they make.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.auth import Identity
from services.common.db import read_only
from services.common.logging import get_logger
from services.upload.errors import TooManyUploads, UploadNotActive
from services.upload.files.tree import new_id
from services.upload.ingest.allowance import check_size
from services.upload.ingest.chunks import ChunkOutcome, ChunkStore
from services.upload.ingest.uploads import Uploads
from services.upload.merge.inline import InlineMerges
from services.upload.models import (
    ABORTED,
    EXPIRED,
    MERGING,
    UPLOADING,
    TusUploadRow,
    UploadRow,
    utcnow,
)
from services.upload.settings import UploadSettings
from services.upload.storage.blob_store import BlobStore
from services.upload.tus.pieces import (
    Charge,
    ChunkSink,
    Layout,
    ParkedSink,
    PieceSink,
    parked_key,
    parked_prefix,
    write_pieces,
)
from services.upload.tus.protocol import FINAL, PARTIAL, SINGLE, TusError, parse_metadata
from services.upload.tus.sweep import sweep_expired
from services.upload.tus.tails import Tails
from services.upload.tus.targets import create_request, replace_row

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class TusState:
    """An upload as HEAD reports it."""

    row: TusUploadRow
    # The Serentak upload (None: parked).
    upload: UploadRow | None
    # Bytes stored durably; None for a final upload not yet assembled.
    offset: int | None
    # When an unfinished upload expires; None once it is finished.
    expires_at: datetime | None
    # Every piece stored: nothing more to write.
    finished: bool = False

    @property
    def layout(self) -> Layout:
        """The upload's pieces."""
        return Layout(self.row.chunk_size, self.row.length)


class TusUploads:
    """The tus use cases, each scoped to the caller (another user's or tenant's upload
    is not found)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        settings: UploadSettings,
        uploads: Uploads,
        chunks: ChunkStore,
        blobs: BlobStore,
        tails: Tails,
        inline: InlineMerges | None,
        on_merge_started: Callable[[], None],
    ) -> None:
        self._sessions = sessions
        self._settings = settings
        self._uploads = uploads
        self._chunks = chunks
        self._blobs = blobs
        self.tails = tails
        self._inline = inline
        # As the gRPC servicer: a small upload's last chunk merges it in that request.
        self._claim = (
            inline.small_claimer(settings.inline_merge_max_bytes)
            if inline is not None and settings.inline_merge_max_bytes > 0
            else None
        )
        self._on_merge_started = on_merge_started
        self.chunk_size = min(settings.tus_chunk_size, settings.max_chunk_size)
        self.max_size = min(settings.max_upload_bytes, settings.max_total_chunks * self.chunk_size)
        self._assemblies: set[asyncio.Task[int]] = set()

    # -- create -------------------------------------------------------------------------

    async def create(
        self,
        identity: Identity,
        *,
        kind: str,
        length: int | None,
        raw_metadata: str,
        metadata: dict[str, str],
        concat: str = "",
    ) -> TusUploadRow:
        """A new upload: with its Serentak upload when it makes a file of known length,
        else parked (partial, or length deferred: its target is checked now all the same)."""
        self._check_length(length)
        now = utcnow()
        tus_id = new_id()
        row = TusUploadRow(
            id=tus_id,
            tenant_id=identity.tenant_id,
            owner_user_id=identity.user_id,
            upload_id=None,
            kind=kind,
            length=length,
            chunk_size=self.chunk_size,
            pieces=0,
            upload_metadata=raw_metadata,
            concat=concat,
            created_at=now,
            expires_at=now + timedelta(seconds=self._settings.upload_ttl_seconds),
        )
        makes_file = kind != PARTIAL
        upload: UploadRow | None = None
        if makes_file:
            prepared = await self._uploads.prepare(
                identity, create_request(metadata, length or 0, self.chunk_size)
            )
            if length is not None:
                upload = prepared.row
        async with self._sessions.begin() as session:
            if kind != FINAL:  # a final consumes its partials: CreateUpload's own cap only
                await self._check_open_cap(session, identity)
            if upload is not None:
                await self._uploads.insert(session, identity, upload)
                row.upload_id = upload.id
            session.add(row)
        log.info(
            "tus_upload_created", tus_id=tus_id, kind=kind, length=length, upload_id=row.upload_id
        )
        return row

    def _check_length(self, length: int | None) -> None:
        if length is not None and length > self.max_size:
            raise TusError(
                413, "UPLOAD_TOO_LARGE", f"Upload-Length is over Tus-Max-Size {self.max_size}"
            )
        check_size(self._settings, length or 0)

    async def _check_open_cap(self, session: AsyncSession, identity: Identity) -> None:
        """The user's open-upload cap counts parked tus uploads (partial, or length not yet
        sent) with their open Serentak uploads; run in the creating transaction, under
        CreateUpload's per-tenant lock on PostgreSQL (SQLite's write lock serialises)."""
        if session.get_bind().dialect.name == "postgresql":
            await session.execute(
                text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
                {"key": f"upload-allowance:{identity.tenant_id}"},
            )
        parked = await session.scalar(
            select(func.count()).where(
                TusUploadRow.tenant_id == identity.tenant_id,
                TusUploadRow.owner_user_id == identity.user_id,
                TusUploadRow.upload_id.is_(None),
                TusUploadRow.terminated_at.is_(None),
                TusUploadRow.expires_at > utcnow(),
            )
        )
        opened = await session.scalar(
            select(func.count()).where(
                UploadRow.tenant_id == identity.tenant_id,
                UploadRow.owner_user_id == identity.user_id,
                UploadRow.status.in_((UPLOADING, MERGING)),
            )
        )
        cap = self._settings.max_open_uploads_per_user
        if (parked or 0) + (opened or 0) >= cap:
            raise TooManyUploads(
                f"at most {cap} open uploads per user (tus partial and deferred ones count);"
                " finish or terminate one first",
                limit=cap,
            )

    # -- read ---------------------------------------------------------------------------

    async def load(self, identity: Identity, tus_id: str) -> TusUploadRow:
        """The caller's upload `tus_id`: 404 when not theirs or unknown, 410 when terminated."""
        if len(tus_id) != 32 or any(c not in "0123456789abcdef" for c in tus_id):
            raise TusError(404, "UPLOAD_NOT_FOUND", "no such upload")
        async with self._sessions() as session:
            await read_only(session)
            row = await session.scalar(
                select(TusUploadRow).where(
                    TusUploadRow.id == tus_id,
                    TusUploadRow.tenant_id == identity.tenant_id,
                    TusUploadRow.owner_user_id == identity.user_id,
                )
            )
        if row is None:
            raise TusError(404, "UPLOAD_NOT_FOUND", "no such upload")
        if row.terminated_at is not None:
            raise TusError(410, "UPLOAD_TERMINATED", "the upload was terminated")
        return row

    async def state(self, identity: Identity, row: TusUploadRow) -> TusState:
        """The upload's durable offset (stored pieces plus this replica's tail)."""
        layout = Layout(row.chunk_size, row.length)
        count = layout.count()
        upload = None
        expires: datetime | None = row.expires_at
        if row.upload_id is not None:
            upload, missing = await self._uploads.get(identity, row.upload_id)
            if upload.status in (ABORTED, EXPIRED):
                raise TusError(410, "UPLOAD_GONE", f"the upload is {upload.status}")
            if upload.status == UPLOADING:
                stored = missing[0][0] if missing else upload.total_chunks
                expires = min(row.expires_at, upload.expires_at)
            else:  # merging, completed or failed: every byte was received
                stored = upload.total_chunks
                expires = None
        else:
            if row.expires_at <= utcnow():
                raise TusError(410, "UPLOAD_EXPIRED", "the upload expired")
            stored = row.pieces
        finished = count is not None and stored >= count
        if finished:
            offset: int | None = row.length
        elif row.kind == FINAL:
            offset = None
        else:
            offset = stored * row.chunk_size + self.tails.size(row.id, stored)
        return TusState(row, upload, offset, expires, finished)

    # -- write --------------------------------------------------------------------------

    async def write(
        self,
        identity: Identity,
        state: TusState,
        blocks: AsyncIterator[bytes],
        length: int | None = None,
        charge: Charge | None = None,
    ) -> TusState:
        """Apply a PATCH body at the state's offset (checked by the caller); `length`: an
        Upload-Length sent now for a deferred upload; `charge`: awaited before each chunk
        the request stores after its first (the rate limit)."""
        row = state.row
        assert state.offset is not None
        if length is not None and row.length is None:
            row = await self._set_length(identity, state, length)
        elif state.finished:
            return state  # an empty PATCH at the end (the caller refused any byte past it)
        await write_pieces(
            self.tails,
            row.id,
            Layout(row.chunk_size, row.length),
            self._sink(identity, row),
            state.offset,
            blocks,
            charge,
        )
        async with self._sessions.begin() as session:
            await session.execute(
                update(TusUploadRow)
                .where(TusUploadRow.id == row.id)
                .values(expires_at=utcnow() + timedelta(seconds=self._settings.upload_ttl_seconds))
            )
        return await self.state(identity, await self.load(identity, row.id))

    def _sink(self, identity: Identity, row: TusUploadRow) -> PieceSink:
        if row.upload_id is None:
            return ParkedSink(self._blobs, self._sessions, row.id)
        return ChunkSink(
            self._chunks, identity, row.upload_id, "sha256", self._claim, self._finished
        )

    async def _finished(self, outcome: ChunkOutcome) -> None:
        """After a chunk: the one that completed the upload merges it (inline if small)."""
        if outcome.claimed is not None and self._inline is not None:
            await self._inline.run(outcome.claimed)
        elif outcome.started_merge:
            self._on_merge_started()

    async def _set_length(self, identity: Identity, state: TusState, length: int) -> TusUploadRow:
        """Upload-Length for a deferred upload: at least the bytes already sent. A file
        upload gets its Serentak upload now (quota and limits checked) and its parked
        pieces become its first chunks."""
        row = state.row
        assert state.offset is not None
        if length < state.offset:
            raise TusError(400, "INVALID_LENGTH", "Upload-Length is below Upload-Offset")
        self._check_length(length)
        upload_id = None
        if row.kind == SINGLE:
            metadata = parse_metadata(row.upload_metadata)
            request = create_request(metadata, length, self.chunk_size, crid=f"tus:{row.id}")
            upload = await self._uploads.create(identity, request)
            upload_id = upload.id
        async with self._sessions.begin() as session:
            await session.execute(
                update(TusUploadRow)
                .where(TusUploadRow.id == row.id, TusUploadRow.length.is_(None))
                .values(length=length, upload_id=upload_id)
            )
        fresh = replace_row(row, length=length, upload_id=upload_id)
        if upload_id is not None and row.pieces:
            # The parked pieces, in order, become chunks 0..pieces-1; the tail stays the tail.
            await write_pieces(
                self.tails,
                row.id,
                Layout(row.chunk_size, length),
                self._sink(identity, fresh),
                0,
                self._parked_blocks([(row.id, row.pieces)]),
            )
            await self._blobs.delete_prefix(parked_prefix(row.id))
        return fresh

    async def _parked_blocks(self, items: list[tuple[str, int]]) -> AsyncIterator[bytes]:
        for tus_id, pieces in items:
            for index in range(pieces):
                yield await self._blobs.read(parked_key(tus_id, index))

    # -- terminate ----------------------------------------------------------------------

    async def terminate(self, identity: Identity, row: TusUploadRow) -> None:
        """DELETE: abort its Serentak upload if still uploading (a file it already made
        stays), drop its parked pieces and tails; the URL answers 410 from now on."""
        if row.upload_id is not None:
            try:
                await self._uploads.abort(identity, row.upload_id)
            except UploadNotActive:
                pass
        async with self._sessions.begin() as session:
            await session.execute(
                update(TusUploadRow)
                .where(TusUploadRow.id == row.id, TusUploadRow.terminated_at.is_(None))
                .values(terminated_at=utcnow())
            )
        await self.tails.remove(row.id)
        await self._blobs.delete_prefix(parked_prefix(row.id))
        log.info("tus_upload_terminated", tus_id=row.id, upload_id=row.upload_id)

    # -- concatenate --------------------------------------------------------------------

    async def concatenate(
        self,
        identity: Identity,
        partial_ids: list[str],
        *,
        raw_metadata: str,
        metadata: dict[str, str],
        concat: str,
    ) -> TusState:
        """A final upload: the finished partials' bytes, in the order given, as one
        Serentak upload (re-cut into its chunks; the partials stay until they expire)."""
        partials = []
        for partial_id in partial_ids:
            partial = await self.load(identity, partial_id)
            if partial.kind != PARTIAL:
                raise TusError(400, "NOT_PARTIAL", f"upload {partial_id} is not a partial upload")
            state = await self.state(identity, partial)
            if state.offset is None or state.offset != partial.length:
                raise TusError(400, "PARTIAL_UNFINISHED", f"upload {partial_id} is unfinished")
            partials.append(partial)
        total = sum(p.length or 0 for p in partials)
        row = await self.create(
            identity,
            kind=FINAL,
            length=total,
            raw_metadata=raw_metadata,
            metadata=metadata,
            concat=concat,
        )
        pieces = [(p.id, Layout(p.chunk_size, p.length).count() or 0) for p in partials]
        # Shielded: a client that goes away does not leave the final half-assembled.
        task = asyncio.ensure_future(
            write_pieces(
                self.tails,
                row.id,
                Layout(row.chunk_size, total),
                self._sink(identity, row),
                0,
                self._parked_blocks(pieces),
            )
        )
        self._assemblies.add(task)
        task.add_done_callback(self._assemblies.discard)
        await asyncio.shield(task)
        return await self.state(identity, row)

    # -- sweep --------------------------------------------------------------------------

    async def sweep(self) -> int:
        """Delete uploads past expires_at (their parked chunks and tails; a Serentak
        upload's own expiry handles its chunks); returns how many."""
        return await sweep_expired(
            self._sessions, self._blobs, self.tails, self._settings.upload_ttl_seconds
        )

    async def close(self) -> None:
        """Stop assemblies still running (shutdown): the chunks they stored stay; the
        client's final upload is left unfinished and the client creates it again."""
        for task in list(self._assemblies):
            task.cancel()
        await asyncio.gather(*self._assemblies, return_exceptions=True)
