"""ListFolder: one page of a folder's children with the caller's role on each.

The caller's role is worked out once per request: one bounded query walks up from the
folder (with the caller's shares on the way), one reads the caller's direct shares on the
page's rows, and each row's role follows from those (`permissions.child_role`), so the
queries per listing do not grow with depth or rows. The cache holds only what every
caller sees alike (the rows, without roles); rows the caller has no role on are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from serentak.upload.v1 import upload_pb2
from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.auth import Identity
from services.common.page_tokens import PageTokens
from services.upload import convert, pagination
from services.upload.errors import FileNotFound, WrongKind
from services.upload.files.listing_cache import ListingCache, listing_key
from services.upload.files.permissions import (
    chain,
    child_role,
    inherited,
    load_file,
    role_in_chain,
    shares_of,
)
from services.upload.files.visibility import hidden_file_ids, visible
from services.upload.models import FOLDER, FileRow


@dataclass(frozen=True, slots=True)
class Page:
    """A cached page: the same for every caller (File messages carry no role)."""

    files: tuple[upload_pb2.File, ...]
    next_page_token: str


async def list_page(
    session: AsyncSession,
    cache: ListingCache,
    tokens: PageTokens,
    identity: Identity,
    folder_id: str,
    request: upload_pb2.ListFolderRequest,
) -> upload_pb2.ListFolderResponse:
    """The page of `folder_id` asked for, as the caller may see it."""
    size = pagination.page_size(request.page_size)
    # Bound to the folder: a token from one folder's listing is refused by another's.
    scope = f"ListFolder:{folder_id}"
    position = tokens.decode(request.page_token, scope, 2)
    folder = await load_file(session, identity, folder_id)
    links = await chain(session, identity.tenant_id, folder.id, identity.user_id)
    if role_in_chain(identity, links) is None:
        raise FileNotFound("file not found", file_id=folder_id)
    if folder.kind != FOLDER:
        raise WrongKind("folder_id is not a folder", file_id=folder_id)
    key = listing_key(
        folder.id,
        folder.children_version,
        f"{request.page_token}:{size}:{int(request.include_deleted)}",
    )
    page: Page | None = cache.get(key)
    # A tombstone does not move the folder's version: a cached page that shows a file
    # tombstoned since is dropped and read again.
    if page is not None and await hidden_file_ids(
        session, identity.tenant_id, [f.file_id for f in page.files]
    ):
        page = None
    if page is None:
        page = await _read_page(
            session, tokens, scope, folder, size, position, request.include_deleted
        )
        cache.put(key, page)
    shares = await shares_of(session, identity.user_id, [f.file_id for f in page.files])
    resp = upload_pb2.ListFolderResponse(
        folder_version=folder.children_version, next_page_token=page.next_page_token
    )
    folder_shared = inherited(links, folder.owner_user_id)
    for cached in page.files:
        role = child_role(
            identity,
            folder.owner_user_id,
            folder_shared,
            cached.owner_user_id,
            shares.get(cached.file_id),
        )
        if role is None:
            continue  # another owner's item the caller was not given
        entry = resp.files.add()
        entry.CopyFrom(cached)
        entry.role = convert.ROLE[role]
    return resp


async def _read_page(
    session: AsyncSession,
    tokens: PageTokens,
    scope: str,
    folder: FileRow,
    size: int,
    position: list[str | int] | None,
    include_deleted: bool,
) -> Page:
    query = select(FileRow).where(
        FileRow.tenant_id == folder.tenant_id,
        FileRow.parent_id == folder.id,
        # Tombstoned synced files stay in the database but leave every listing.
        visible(FileRow.__table__.c.id, FileRow.__table__.c.tenant_id),
    )
    if not include_deleted:
        query = query.where(FileRow.deleted_at.is_(None))
    if position is not None:
        name, last_id = str(position[0]), str(position[1])
        query = query.where(
            or_(FileRow.name > name, and_(FileRow.name == name, FileRow.id > last_id))
        )
    rows = list(
        (await session.execute(query.order_by(FileRow.name, FileRow.id).limit(size + 1))).scalars()
    )
    token = ""
    if len(rows) > size:
        token = tokens.encode(scope, [rows[size - 1].name, rows[size - 1].id])
    return Page(tuple(convert.file_message(row, None) for row in rows[:size]), token)
