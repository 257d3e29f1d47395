"""Helpers for upload tests: typed-error reading, chunking, waiting for an upload's status."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterable
from typing import Any

import grpc
from google.rpc import error_details_pb2
from serentak.events.v1 import events_pb2
from serentak.sdk.locks import LockClient
from serentak.upload.v1 import upload_pb2
from sqlalchemy import func, select
from support.grpc_errors import error_info

from services.common.db import create_engine, session_factory
from services.common.outbox.models import outbox_events
from services.upload.ingest.chunks import ChunkStore
from services.upload.merge.merge_job import enqueue_merge
from services.upload.models import ChunkRow, UploadRow

DEADLINE_S = 60.0
# Who takes a file's `file:` lock from outside the merge: the operator, in alice's tenant
# (`file:` keys are the merge's and the operators', never a user's; issue 33).
FILE_LOCK_TOKEN, FILE_LOCK_TENANT = "dev-ops", "acme"


def file_lock_client(locks_address: str, owner: str) -> LockClient:
    """A lock client that may hold a file's lock against the merge (the operator's)."""
    return LockClient(locks_address, owner=owner, token=FILE_LOCK_TOKEN, tenant_id=FILE_LOCK_TENANT)


async def expect_error(
    call: Any, code: grpc.StatusCode, reason: str
) -> error_details_pb2.ErrorInfo:
    """Await `call`; assert it fails with `code` and ErrorInfo `reason`."""
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        info = error_info(exc)
        assert (exc.code(), info.reason) == (code, reason), (exc.code(), info.reason, exc.details())
        return info
    raise AssertionError(f"expected {code.name}/{reason}, the call succeeded")


class CallerContext:
    """The one piece of a servicer context the upload servicer reads: the caller's token
    (alice's), for tests that call the servicer directly."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", "Bearer dev-alice"),)


def sha256(data: bytes) -> str:
    """Hex sha256."""
    return hashlib.sha256(data).hexdigest()


def split(data: bytes, chunk_size: int) -> list[bytes]:
    """`data` cut into chunks (one empty chunk for empty data)."""
    return [data[i : i + chunk_size] for i in range(0, len(data), chunk_size)] or [b""]


def create_request(
    data: bytes, chunk_size: int, name: str = "f.bin", folder_id: str = "", **kw: Any
) -> upload_pb2.CreateUploadRequest:
    """A CreateUploadRequest for `data` cut at `chunk_size` as a new file."""
    return upload_pb2.CreateUploadRequest(
        new_file=upload_pb2.NewFileTarget(folder_id=folder_id, name=name),
        total_chunks=len(split(data, chunk_size)),
        total_size=len(data),
        chunk_size=chunk_size,
        **kw,
    )


def chunk_request(upload_id: str, index: int, data: bytes) -> upload_pb2.PutChunkRequest:
    """A PutChunkRequest with the right checksum."""
    return upload_pb2.PutChunkRequest(
        upload_id=upload_id, chunk_index=index, data=data, checksum=sha256(data)
    )


async def put_chunks(
    client: Any, upload_id: str, chunks: list[bytes], indexes: Iterable[int] | None = None
) -> None:
    """PutChunk each of `chunks` named by `indexes` (default: all), in that order."""
    for i in range(len(chunks)) if indexes is None else indexes:
        await client.uploads.PutChunk(
            chunk_request(upload_id, i, chunks[i]), metadata=client.metadata
        )


async def upload_completed(
    client: Any, data: bytes, chunk_size: int, **create: Any
) -> upload_pb2.Upload:
    """Upload `data` as a new file (`create`: create_request's name, folder_id, ...): create,
    send every chunk, and return the upload once COMPLETED."""
    upload = await client.uploads.CreateUpload(
        create_request(data, chunk_size, **create), metadata=client.metadata
    )
    await put_chunks(client, upload.upload_id, split(data, chunk_size))
    return await wait_status(client, upload.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)


def chunk_store_over(parts: Any, blobs: Any) -> ChunkStore:
    """The upload components' (`parts` fixture) chunk store, writing to `blobs` instead
    (a store a test gates or fails)."""
    return ChunkStore(
        parts.sessions,
        parts.uploads,
        blobs,
        enqueue_merge,
        upload_ttl_seconds=parts.settings.upload_ttl_seconds,
    )


async def chunk_row_count(sessions: Any, upload_id: str) -> int:
    """How many chunk rows the upload has in the database."""
    async with sessions() as session:
        return int(
            await session.scalar(
                select(func.count()).select_from(ChunkRow).where(ChunkRow.upload_id == upload_id)
            )
            or 0
        )


async def wait_chunks_purged(
    sessions: Any, upload_id: str, why: str, deadline_s: float = 30.0
) -> UploadRow:
    """Poll the upload's row until `chunks_purged_at` is set, the last step of a chunk
    purge (the commit's purge job, or the expiry sweep); the row then. `why` names the
    purge in the deadline's message."""
    deadline = time.monotonic() + deadline_s
    while True:
        async with sessions() as session:
            row = await session.get(UploadRow, upload_id)
        assert row is not None, f"no upload {upload_id}"
        if row.chunks_purged_at is not None:
            return row
        assert time.monotonic() < deadline, f"{why} never purged the chunks"
        await asyncio.sleep(0.05)


async def content_updated_uploads(database_url: str) -> list[str]:
    """The upload id of every file.content.updated event in the outbox, in stored order."""
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            rows = (
                await session.execute(select(outbox_events.c.event).order_by(outbox_events.c.id))
            ).scalars()
            events = [events_pb2.Event.FromString(r) for r in rows]
    finally:
        await engine.dispose()
    return [
        e.file_content_updated.upload_id for e in events if e.event_type == "file.content.updated"
    ]


async def wait_status(
    client: Any, upload_id: str, *statuses: int, deadline_s: float = DEADLINE_S
) -> upload_pb2.Upload:
    """Poll GetUpload until it reaches one of `statuses`; fail after `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    while True:
        upload = await client.uploads.GetUpload(
            upload_pb2.GetUploadRequest(upload_id=upload_id), metadata=client.metadata
        )
        if upload.status in statuses:
            return upload
        assert time.monotonic() < deadline, f"upload stuck in {upload.status} for {deadline_s} s"
        await asyncio.sleep(0.02)


async def download(client: Any, file_id: str, offset: int = 0) -> tuple[bytes, dict[str, str]]:
    """The file's bytes and trailing metadata via Download."""
    call = client.files.Download(
        upload_pb2.DownloadRequest(file_id=file_id, offset=offset), metadata=client.metadata
    )
    parts = [chunk.data async for chunk in call]
    trailing = {k: v for k, v in (await call.trailing_metadata() or ())}
    return b"".join(parts), trailing
