"""The folder tree's basics: names, each user's root folder, new ids."""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.auth import Identity
from services.common.errors import InvalidArgument
from services.upload.models import FOLDER, FileRow, utcnow

MAX_NAME_LENGTH = 255


def new_id() -> str:
    """A fresh random id (32 hex characters)."""
    return uuid.uuid4().hex


def validate_name(name: str, field: str = "name") -> str:
    """A usable file or folder name, or INVALID_ARGUMENT naming `field`."""
    if not name or not name.strip():
        raise InvalidArgument(field, "must not be empty", reason="INVALID_NAME")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidArgument(
            field, f"longer than {MAX_NAME_LENGTH} characters", reason="INVALID_NAME"
        )
    if name in (".", "..") or "/" in name or "\x00" in name or not name.isprintable():
        raise InvalidArgument(field, "has a forbidden character or form", reason="INVALID_NAME")
    return name


def new_folder(
    tenant_id: str, parent_id: str | None, name: str, owner_user_id: str, **keys: str | None
) -> FileRow:
    """A new, empty folder row at version 1 (`keys`: root_of or create_request_key)."""
    now = utcnow()
    return FileRow(
        id=new_id(),
        tenant_id=tenant_id,
        parent_id=parent_id,
        name=name,
        kind=FOLDER,
        owner_user_id=owner_user_id,
        version=1,
        children_version=0,
        size=0,
        checksum="",
        checksum_algorithm="",
        last_lock_token=0,
        created_at=now,
        updated_at=now,
        **keys,
    )


def root_key(identity: Identity) -> str:
    """The unique marker of a user's root folder."""
    return f"{identity.tenant_id}:{identity.user_id}"


async def find_root(session: AsyncSession, identity: Identity) -> FileRow | None:
    """The caller's root folder if it exists."""
    return (
        await session.execute(select(FileRow).where(FileRow.root_of == root_key(identity)))
    ).scalar_one_or_none()


async def ensure_root(sessions: async_sessionmaker[AsyncSession], identity: Identity) -> str:
    """The id of the caller's root folder, created on first use (race-safe)."""
    async with sessions() as session:
        root = await find_root(session, identity)
        if root is not None:
            return root.id
    try:
        async with sessions.begin() as session:
            root = new_folder(
                identity.tenant_id, None, "", identity.user_id, root_of=root_key(identity)
            )
            session.add(root)
            return root.id
    except IntegrityError:
        # Another request created it first: use theirs.
        async with sessions() as session:
            found = await find_root(session, identity)
            assert found is not None
            return found.id
