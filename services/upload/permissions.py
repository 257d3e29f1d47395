"""Who may do what to a file: owner, editor (via a share on it or an ancestor), viewer.

A file the caller has no role on, or one in another tenant, is NOT_FOUND: the answer never
reveals that it exists.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.auth import Identity
from services.upload.errors import FileNotFound, NotAllowed
from services.upload.models import EDITOR, VIEWER, FileRow, ShareRow

OWNER = "owner"
_RANK = {None: 0, VIEWER: 1, EDITOR: 2, OWNER: 3}
# Folders nest at most this deep when roles are inherited (a guard against cycles).
MAX_DEPTH = 64


def role_rank(role: str | None) -> int:
    """Ordering of roles: none < viewer < editor < owner."""
    return _RANK[role]


async def load_file(session: AsyncSession, identity: Identity, file_id: str) -> FileRow:
    """The file `file_id` in the caller's tenant (no role check), or FILE_NOT_FOUND."""
    if not file_id:
        raise FileNotFound("file not found", file_id=file_id)
    row = (
        await session.execute(
            select(FileRow).where(FileRow.id == file_id, FileRow.tenant_id == identity.tenant_id)
        )
    ).scalar_one_or_none()
    if row is None:
        raise FileNotFound("file not found", file_id=file_id)
    return row


async def role_of(session: AsyncSession, identity: Identity, file: FileRow) -> str | None:
    """The caller's role on `file`: owner, or the best share on it or any ancestor folder."""
    if file.tenant_id != identity.tenant_id:
        return None
    best: str | None = None
    current: FileRow | None = file
    for _ in range(MAX_DEPTH):
        if current is None:
            break
        if current.owner_user_id == identity.user_id:
            return OWNER
        share = await session.get(ShareRow, (current.id, identity.user_id))
        if share is not None and role_rank(share.role) > role_rank(best):
            best = share.role
        if current.parent_id is None:
            break
        current = await session.get(FileRow, current.parent_id)
    return best


async def readable(session: AsyncSession, identity: Identity, file_id: str) -> tuple[FileRow, str]:
    """The file and the caller's role if they may read it; else FILE_NOT_FOUND."""
    file = await load_file(session, identity, file_id)
    role = await role_of(session, identity, file)
    if role is None:
        raise FileNotFound("file not found", file_id=file_id)
    return file, role


async def writable(session: AsyncSession, identity: Identity, file_id: str) -> tuple[FileRow, str]:
    """The file and role if the caller may change it (owner or editor); else an error."""
    file, role = await readable(session, identity, file_id)
    if role_rank(role) < role_rank(EDITOR):
        raise NotAllowed("changing this file needs the editor role", file_id=file_id, role=role)
    return file, role


async def owned(session: AsyncSession, identity: Identity, file_id: str) -> FileRow:
    """The file if the caller owns it (sharing is the owner's call); else an error."""
    file, role = await readable(session, identity, file_id)
    if role != OWNER:
        raise NotAllowed("only the owner can do this", file_id=file_id, role=role)
    return file


async def audience(session: AsyncSession, file: FileRow) -> list[str]:
    """Owner and collaborators of `file` (incl. inherited shares), sorted: an event's audience."""
    users = {file.owner_user_id}
    current: FileRow | None = file
    for _ in range(MAX_DEPTH):
        if current is None:
            break
        users.add(current.owner_user_id)
        shares = await session.execute(
            select(ShareRow.user_id).where(ShareRow.file_id == current.id)
        )
        users.update(shares.scalars())
        if current.parent_id is None:
            break
        current = await session.get(FileRow, current.parent_id)
    return sorted(users)
