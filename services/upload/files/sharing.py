"""Sharing a file: granting and revoking collaborators, and listing them.

A share change is a change of the file: it bumps the file's version and records its outbox
event in the same transaction (invariant 6), like every other change in `files.py`. The
revoked user of an unshare is still told (the event's audience includes them).
"""

from __future__ import annotations

from serentak.upload.v1 import upload_pb2
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common import validation
from services.common.auth import Identity
from services.common.db import read_only
from services.common.errors import InvalidArgument
from services.upload import convert
from services.upload.errors import FileNotFound
from services.upload.files.events import record_file_event
from services.upload.files.permissions import owned, readable
from services.upload.files.versions import bump, touch_folder
from services.upload.models import FileRow, ShareRow, utcnow


async def share(
    sessions: async_sessionmaker[AsyncSession],
    identity: Identity,
    request: upload_pb2.ShareFileRequest,
) -> FileRow:
    """Grant `user_id` viewer or editor (owner only); the file as committed."""
    role_name = convert.ROLE_NAME.get(request.role)
    if role_name is None:
        raise InvalidArgument("role", "must be ROLE_VIEWER or ROLE_EDITOR")
    validation.principal_id(request.user_id, "user_id")
    validation.resource_id(request.file_id, "file_id")
    if request.user_id == identity.user_id:
        raise InvalidArgument("user_id", "the owner cannot share with themselves")
    async with sessions.begin() as session:
        file = await owned(session, identity, request.file_id)
        existing = await session.get(ShareRow, (file.id, request.user_id))
        if existing is None:
            session.add(
                ShareRow(
                    file_id=file.id,
                    user_id=request.user_id,
                    role=role_name,
                    granted_by=identity.user_id,
                    granted_at=utcnow(),
                )
            )
        else:
            existing.role = role_name
        await session.flush()
        file = await bump(session, file, request.expected_version)
        await touch_folder(session, file.parent_id)
        await record_file_event(
            session,
            "file.shared",
            file,
            identity.user_id,
            file_id=file.id,
            name=file.name,
            user_id=request.user_id,
            role=role_name,
        )
    return file


async def unshare(
    sessions: async_sessionmaker[AsyncSession],
    identity: Identity,
    request: upload_pb2.UnshareFileRequest,
) -> FileRow:
    """Revoke a collaborator (owner only); the file as committed."""
    validation.principal_id(request.user_id, "user_id")
    validation.resource_id(request.file_id, "file_id")
    async with sessions.begin() as session:
        file = await owned(session, identity, request.file_id)
        result = await session.execute(
            delete(ShareRow).where(ShareRow.file_id == file.id, ShareRow.user_id == request.user_id)
        )
        if not result.rowcount:  # type: ignore[attr-defined]
            raise FileNotFound(
                "no such collaborator",
                reason="COLLABORATOR_NOT_FOUND",
                file_id=file.id,
                user_id=request.user_id,
            )
        file = await bump(session, file, request.expected_version)
        await touch_folder(session, file.parent_id)
        await record_file_event(
            session,
            "file.unshared",
            file,
            identity.user_id,
            file_id=file.id,
            name=file.name,
            user_id=request.user_id,
        )
    return file


async def collaborators(
    sessions: async_sessionmaker[AsyncSession], identity: Identity, file_id: str
) -> list[ShareRow]:
    """Direct shares of a file the caller can read, by user id."""
    async with sessions() as session:
        await read_only(session)
        file, _ = await readable(session, identity, validation.resource_id(file_id, "file_id"))
        rows = await session.execute(
            select(ShareRow).where(ShareRow.file_id == file.id).order_by(ShareRow.user_id)
        )
        return list(rows.scalars())
