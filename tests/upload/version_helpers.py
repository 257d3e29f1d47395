"""Helpers for the version-history tests (files/history.py, merge/restore_version.py)."""

from __future__ import annotations

from typing import Any

from serentak.events.v1 import events_pb2
from serentak.upload.v1 import upload_pb2
from sqlalchemy import select

from services.common.db import create_engine, session_factory
from services.common.outbox.models import outbox_events


async def new_file(
    client: Any, data: bytes, name: str, folder_id: str = ""
) -> upload_pb2.UploadFileResponse:
    """`name` in `folder_id` (default: the caller's root), committed (UploadFile)."""
    target = upload_pb2.NewFileTarget(name=name, folder_id=folder_id)
    return await client.uploads.UploadFile(
        upload_pb2.UploadFileRequest(new_file=target, data=data), metadata=client.metadata
    )


async def new_version(client: Any, file_id: str, data: bytes) -> upload_pb2.UploadFileResponse:
    """The next version of `file_id`, committed (UploadFile)."""
    return await client.uploads.UploadFile(
        upload_pb2.UploadFileRequest(file_id=file_id, data=data), metadata=client.metadata
    )


async def versions(client: Any, file_id: str, **kw: Any) -> upload_pb2.ListVersionsResponse:
    """One ListVersions page."""
    return await client.files.ListVersions(
        upload_pb2.ListVersionsRequest(file_id=file_id, **kw), metadata=client.metadata
    )


def restore(client: Any, file_id: str, version: int, **kw: Any) -> Any:
    """A RestoreVersion call (awaitable)."""
    return client.files.RestoreVersion(
        upload_pb2.RestoreVersionRequest(file_id=file_id, version=version, **kw),
        metadata=client.metadata,
    )


async def read(client: Any, file_id: str, **kw: Any) -> tuple[bytes, dict[str, str]]:
    """Download's bytes and trailing metadata (`version`, `offset`, `length` as given)."""
    call = client.files.Download(
        upload_pb2.DownloadRequest(file_id=file_id, **kw), metadata=client.metadata
    )
    parts = [chunk.data async for chunk in call]
    return b"".join(parts), {k: v for k, v in (await call.trailing_metadata() or ())}


async def content_events(database_url: str, file_id: str = "") -> list[events_pb2.Event]:
    """The file's file.content.updated events in the outbox (every file's without
    `file_id`), in stored order."""
    engine = create_engine(database_url)
    stmt = select(outbox_events.c.event).where(outbox_events.c.event_type == "file.content.updated")
    if file_id:
        stmt = stmt.where(outbox_events.c.aggregate_id == file_id)
    try:
        async with session_factory(engine)() as session:
            rows = (await session.execute(stmt.order_by(outbox_events.c.id))).scalars()
            return [events_pb2.Event.FromString(r) for r in rows]
    finally:
        await engine.dispose()
