"""ListSharedWithMe: the live items of the caller's tenant shared directly with the caller.

Each item's `file.role` is the caller's role on it now, as GetFile, ListFolder and
ListChanges say it (a share on a folder above, of the same owner, may give more than this
one); `role` is what this share grants. Items hidden from the tree (sync's tombstones) are
left out, as ListFolder leaves them out. Scoped by the file's tenant (a share row names
only a user id, which another tenant may also have), keyset-paginated by file id with a
signed page token bound to the caller.
"""

from __future__ import annotations

from serentak.upload.v1 import upload_pb2
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.auth import Identity
from services.common.db import read_only
from services.common.errors import InvalidArgument
from services.common.page_tokens import PageTokens
from services.upload import convert
from services.upload.files.change_view import ViewJudge
from services.upload.models import FileRow, ShareRow

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


async def list_shared_with_me(
    sessions: async_sessionmaker[AsyncSession],
    tokens: PageTokens,
    identity: Identity,
    request: upload_pb2.ListSharedWithMeRequest,
) -> upload_pb2.ListSharedWithMeResponse:
    """One page of the items shared with the caller, ordered by file id."""
    if request.page_size < 0 or request.page_size > MAX_PAGE_SIZE:
        raise InvalidArgument("page_size", f"must be 0..{MAX_PAGE_SIZE}")
    size = request.page_size or DEFAULT_PAGE_SIZE
    purpose = f"shared-with-me:{identity.tenant_id}:{identity.user_id}"
    position = tokens.decode(request.page_token, purpose, 1)
    query = (
        select(FileRow, ShareRow)
        .join(ShareRow, ShareRow.file_id == FileRow.id)
        .where(
            ShareRow.user_id == identity.user_id,
            FileRow.tenant_id == identity.tenant_id,
            FileRow.deleted_at.is_(None),
        )
        .order_by(FileRow.id)
        .limit(size + 1)
    )
    if position is not None:
        query = query.where(FileRow.id > str(position[0]))
    response = upload_pb2.ListSharedWithMeResponse()
    async with sessions() as session:
        await read_only(session)
        rows = list((await session.execute(query)).all())
        judge = ViewJudge(session, identity)
        judge.remember([file for file, _ in rows[:size]])
        await judge.load([file.id for file, _ in rows[:size]])
        roles = {file.id: await judge.role(file.id) for file, _ in rows[:size]}
    for file, share in rows[:size]:
        role = roles[file.id]
        if role is None:
            continue  # hidden from the tree
        item = response.items.add(
            file=convert.file_message(file, role),
            role=convert.ROLE[share.role],
            granted_by=share.granted_by,
        )
        ts = convert.timestamp(share.granted_at)
        if ts is not None:
            item.granted_at.CopyFrom(ts)
    if len(rows) > size:
        response.next_page_token = tokens.encode(purpose, [rows[size - 1][0].id])
    return response
