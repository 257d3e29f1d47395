"""Sharing a file: granting and revoking collaborators, and listing them.

A share change is a change of the file: it bumps the file's version and records its outbox
event in the same transaction (invariant 6), like every other change in `files.py`. The
revoked user of an unshare is still told (the event's audience includes them).

A batch of grants (`share_batch`) is one such change: the same checks per grant, one
transaction, one version and one event whose audience holds every collaborator, so a
folder shared with 1,000 people costs one commit and one notification per person, where
1,000 ShareFile calls cost 1,000 commits and, each event going to everyone shared so far,
half a million notifications.
"""

from __future__ import annotations

from dataclasses import dataclass

from serentak.events.v1 import events_pb2
from serentak.upload.v1 import upload_pb2
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common import validation
from services.common.auth import Identity
from services.common.db import read_only
from services.common.errors import InvalidArgument
from services.common.logging import get_logger
from services.upload import convert
from services.upload.errors import FileNotFound
from services.upload.files.events import record_file_event
from services.upload.files.permissions import owned, readable
from services.upload.files.tree import lock_tree
from services.upload.files.versions import bump, touch_folder
from services.upload.models import FileRow, ShareRow, utcnow

log = get_logger(__name__)


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
        await _take_turns(session, identity)
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


@dataclass(frozen=True)
class BatchOutcome:
    """What a batch of grants did: the file as committed and how many grants did what."""

    file: FileRow
    added: int
    changed: int
    unchanged: int


def check_grants(
    identity: Identity, request: upload_pb2.ShareFileBatchRequest, batch_max: int
) -> dict[str, str]:
    """The batch's grants as user id -> role name; INVALID_ARGUMENT naming the bad grant."""
    if not request.grants:
        raise InvalidArgument("grants", "give at least one grant", reason="NO_GRANTS")
    if len(request.grants) > batch_max:
        raise InvalidArgument(
            "grants",
            f"more than {batch_max} grants in one call",
            reason="TOO_MANY_GRANTS",
            limit=batch_max,
        )
    grants: dict[str, str] = {}
    for i, grant in enumerate(request.grants):
        field = f"grants[{i}]"
        role_name = convert.ROLE_NAME.get(grant.role)
        if role_name is None:
            raise InvalidArgument(f"{field}.role", "must be ROLE_VIEWER or ROLE_EDITOR")
        validation.principal_id(grant.user_id, f"{field}.user_id")
        if grant.user_id == identity.user_id:
            raise InvalidArgument(f"{field}.user_id", "the owner cannot share with themselves")
        if grant.user_id in grants:
            raise InvalidArgument(
                f"{field}.user_id", "this user has an earlier grant", reason="DUPLICATE_GRANT"
            )
        grants[grant.user_id] = role_name
    return grants


async def share_batch(
    sessions: async_sessionmaker[AsyncSession],
    identity: Identity,
    request: upload_pb2.ShareFileBatchRequest,
    batch_max: int,
) -> BatchOutcome:
    """Grant every user of the batch its role (owner only), as one change of the file."""
    validation.resource_id(request.file_id, "file_id")
    grants = check_grants(identity, request, batch_max)
    async with sessions.begin() as session:
        await _take_turns(session, identity)
        file = await owned(session, identity, request.file_id)
        rows = await session.execute(
            select(ShareRow).where(ShareRow.file_id == file.id, ShareRow.user_id.in_(list(grants)))
        )
        existing = {row.user_id: row for row in rows.scalars()}
        made: list[tuple[str, str]] = []
        added = changed = 0
        now = utcnow()
        for user_id, role_name in sorted(grants.items()):
            row = existing.get(user_id)
            if row is None:
                session.add(
                    ShareRow(
                        file_id=file.id,
                        user_id=user_id,
                        role=role_name,
                        granted_by=identity.user_id,
                        granted_at=now,
                    )
                )
                added += 1
            elif row.role != role_name:
                row.role = role_name
                changed += 1
            else:
                continue
            made.append((user_id, role_name))
        if made:
            await session.flush()
            file = await bump(session, file, request.expected_version)
            await touch_folder(session, file.parent_id)
            single = made[0] if len(made) == 1 else ("", "")
            await record_file_event(
                session,
                "file.shared",
                file,
                identity.user_id,
                file_id=file.id,
                name=file.name,
                user_id=single[0],
                role=single[1],
                grants=[events_pb2.ShareGrant(user_id=u, role=r) for u, r in made],
            )
    log.info(
        "file_shared_batch",
        file_id=file.id,
        version=file.version,
        added=added,
        changed=changed,
        unchanged=len(grants) - len(made),
    )
    return BatchOutcome(file, added, changed, len(grants) - len(made))


async def _take_turns(session: AsyncSession, identity: Identity) -> None:
    """The tenant's tree lock, first in the transaction: share changes take turns, each
    reading the shares committed before it (two grants of one user must not both insert),
    and in the one lock order every logged change keeps (tree.lock_tree)."""
    await lock_tree(session, identity.tenant_id)


async def unshare(
    sessions: async_sessionmaker[AsyncSession],
    identity: Identity,
    request: upload_pb2.UnshareFileRequest,
) -> FileRow:
    """Revoke a collaborator (owner only); the file as committed."""
    validation.principal_id(request.user_id, "user_id")
    validation.resource_id(request.file_id, "file_id")
    async with sessions.begin() as session:
        await _take_turns(session, identity)
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
