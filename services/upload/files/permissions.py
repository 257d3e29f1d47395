"""The access rules (README "Access rules"), in one place: every use case asks this module.

- The item's owner has the owner role.
- A share on the item, or on a folder above it, gives the shared role (viewer or editor).
  A folder's share reaches down only through items of the *same owner*: the walk up from
  an item stops at the first folder owned by someone else. So moving an item never gives
  anyone access its owner did not grant, and owning a folder gives no role on another
  owner's item inside it.
- Moving needs the editor role on the item and on the destination folder, and either the
  owner role on the item or a destination owned by the item's owner: an editor cannot take
  an item out of its owner's tree.
- An item in another tenant, or one the caller has no role on, is NOT_FOUND: the answer
  never reveals that it exists.

Every walk up the tree is one bounded recursive query (`MAX_DEPTH`), so it ends even if
the tree were ever corrupted into a cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import String, and_, bindparam, literal, select
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.auth import Identity
from services.common.session_rows import loaded
from services.common.session_sql import SessionStatement
from services.common.transaction_memo import transaction_memo
from services.upload.errors import FileNotFound, NotAllowed
from services.upload.models import EDITOR, OWNER, VIEWER, FileRow, ShareRow

_RANK = {None: 0, VIEWER: 1, EDITOR: 2, OWNER: 3}
# A folder has at most MAX_DEPTH - 1 folders above it (files one more): `tree` refuses
# deeper creates and moves, and every walk up reads at most MAX_DEPTH + 1 items.
MAX_DEPTH = 64


def role_rank(role: str | None) -> int:
    """Ordering of roles: none < viewer < editor < owner."""
    return _RANK[role]


def best(a: str | None, b: str | None) -> str | None:
    """The higher of two roles."""
    return a if role_rank(a) >= role_rank(b) else b


@dataclass(frozen=True, slots=True)
class Link:
    """One item on the way up: the item itself first, then its folders."""

    id: str
    parent_id: str | None
    owner: str
    share: str | None  # the caller's direct share on this item, if asked for


# Every column of an item, in table order (the rows `loaded` takes).
_FILE_COLUMNS = [c.key for c in FileRow.__table__.c]


def _walk_up(columns: Sequence[str]) -> Any:
    """The walk up from `:file_id` in `:tenant_id` (a recursive CTE): each item's
    `columns` and its `depth`, bounded by MAX_DEPTH so that it ends even on a cycle."""
    files = FileRow.__table__
    tenant_id = bindparam("tenant_id", type_=String)
    start = (
        select(*(files.c[key] for key in columns), literal(0).label("depth"))
        .where(files.c.id == bindparam("file_id", type_=String), files.c.tenant_id == tenant_id)
        .cte("chain", recursive=True)
    )
    up = files.alias("up")
    return start.union_all(
        select(*(up.c[key] for key in columns), start.c.depth + 1).where(
            up.c.id == start.c.parent_id,
            up.c.tenant_id == tenant_id,
            start.c.depth < MAX_DEPTH,
        )
    )


def _chain_statement(with_shares: bool) -> Any:
    """The walk up from `:file_id` in `:tenant_id`, with `:user_id`'s direct shares if asked
    (built once: a statement made per call costs more than running it)."""
    walk = _walk_up(("id", "parent_id", "owner_user_id"))
    if not with_shares:
        query = select(walk.c.id, walk.c.parent_id, walk.c.owner_user_id, literal(None))
    else:
        shares = ShareRow.__table__
        query = select(walk.c.id, walk.c.parent_id, walk.c.owner_user_id, shares.c.role).outerjoin(
            shares,
            and_(
                shares.c.file_id == walk.c.id,
                shares.c.user_id == bindparam("user_id", type_=String),
            ),
        )
    return query.order_by(walk.c.depth)


_CHAIN = SessionStatement(_chain_statement(with_shares=False))
_CHAIN_WITH_SHARES = SessionStatement(_chain_statement(with_shares=True))


async def chain(
    session: AsyncSession, tenant_id: str, file_id: str, user_id: str | None = None
) -> list[Link]:
    """`file_id` and its folders up to the root (at most MAX_DEPTH + 1), in one query.

    With `user_id`, each link carries that user's direct share. The depth bound makes the
    query end even on a cycle; a chain that is still not at a root is cut there.
    """
    values = {"tenant_id": tenant_id, "file_id": file_id}
    if user_id is None:
        rows = await _CHAIN.rows(session, values)
    else:
        rows = await _CHAIN_WITH_SHARES.rows(session, {**values, "user_id": user_id})
    return [Link(r[0], r[1], r[2], r[3]) for r in rows]


def reaches_root(links: list[Link]) -> bool:
    """True if the chain ends at a root folder (it was not cut by the depth bound)."""
    return bool(links) and links[-1].parent_id is None


def inherited(links: Iterable[Link], owner: str) -> str | None:
    """The best share along `links` from the start while the items belong to `owner`."""
    role: str | None = None
    for link in links:
        if link.owner != owner:
            break
        role = best(role, link.share)
    return role


def role_in_chain(identity: Identity, links: list[Link]) -> str | None:
    """The caller's role on `links[0]` given its chain (with the caller's shares)."""
    if not links:
        return None
    if links[0].owner == identity.user_id:
        return OWNER
    return inherited(links, links[0].owner)


def child_role(
    identity: Identity,
    folder_owner: str,
    folder_shared: str | None,
    child_owner: str,
    child_share: str | None,
) -> str | None:
    """The caller's role on a child without walking up again.

    `folder_shared` is `inherited(folder_links, folder_owner)`, worked out once per listing.
    """
    if child_owner == identity.user_id:
        return OWNER
    if child_owner == folder_owner:
        return best(child_share, folder_shared)
    return child_share


async def shares_of(session: AsyncSession, user_id: str, file_ids: list[str]) -> dict[str, str]:
    """The user's direct shares on `file_ids` (one query): file id -> role."""
    if not file_ids:
        return {}
    rows = await session.execute(
        select(ShareRow.file_id, ShareRow.role).where(
            ShareRow.user_id == user_id, ShareRow.file_id.in_(file_ids)
        )
    )
    return {file_id: role for file_id, role in rows.all()}


# Built once (values bound at execution): composing and cache-keying a statement per call
# cost more than running it.
_FILES = FileRow.__table__.c
_FILE_OF_TENANT = SessionStatement(
    select(*_FILES).where(
        _FILES.id == bindparam("file_id", type_=String),
        _FILES.tenant_id == bindparam("tenant_id", type_=String),
    )
)


async def load_file(session: AsyncSession, identity: Identity, file_id: str) -> FileRow:
    """The file `file_id` in the caller's tenant (no role check), or FILE_NOT_FOUND."""
    if not file_id:
        raise FileNotFound("file not found", file_id=file_id)
    row = await _FILE_OF_TENANT.first(
        session, {"file_id": file_id, "tenant_id": identity.tenant_id}
    )
    if row is None:
        raise FileNotFound("file not found", file_id=file_id)
    return loaded(session, FileRow, row)


async def role_of(session: AsyncSession, identity: Identity, file: FileRow) -> str | None:
    """The caller's role on `file` (None: no access)."""
    if file.tenant_id != identity.tenant_id:
        return None
    if file.owner_user_id == identity.user_id:
        return OWNER
    return role_in_chain(
        identity, await chain(session, identity.tenant_id, file.id, identity.user_id)
    )


async def readable(session: AsyncSession, identity: Identity, file_id: str) -> tuple[FileRow, str]:
    """The file and the caller's role if they may read it; else FILE_NOT_FOUND."""
    file = await load_file(session, identity, file_id)
    role = await role_of(session, identity, file)
    if role is None:
        raise FileNotFound("file not found", file_id=file_id)
    return file, role


async def writable(session: AsyncSession, identity: Identity, file_id: str) -> tuple[FileRow, str]:
    """The file and role if the caller may change it (owner or editor); else an error."""
    file = await load_file(session, identity, file_id)
    return file, await writable_role(session, identity, file)


async def writable_role(session: AsyncSession, identity: Identity, file: FileRow) -> str:
    """`writable` for a file row loaded already: the caller's role, or the same errors."""
    return _may_write(file, await role_of(session, identity, file))


def _may_write(file: FileRow, role: str | None) -> str:
    """`role` if it lets the caller change `file` (owner or editor); else the error."""
    if role is None:
        raise FileNotFound("file not found", file_id=file.id)
    if role_rank(role) < role_rank(EDITOR):
        raise NotAllowed("changing this file needs the editor role", file_id=file.id, role=role)
    return role


async def owned(session: AsyncSession, identity: Identity, file_id: str) -> FileRow:
    """The file if the caller owns it (sharing is the owner's call); else an error."""
    file, role = await readable(session, identity, file_id)
    if role != OWNER:
        raise NotAllowed("only the owner can do this", file_id=file_id, role=role)
    return file


def check_move(role: str, file: FileRow, target: FileRow) -> None:
    """Refuse a move that would take an item out of its owner's tree without owner rights.

    The caller already holds the editor role on both `file` and the folder `target`.
    """
    if role != OWNER and target.owner_user_id != file.owner_user_id:
        raise NotAllowed(
            "only the owner can move an item into a folder of another owner",
            reason="MOVE_NOT_ALLOWED",
            file_id=file.id,
            role=role,
        )


async def audience(session: AsyncSession, file: FileRow) -> list[str]:
    """The file's owner and everyone with a share that reaches it, sorted: an event's audience."""
    return await _audience_from(session, file.tenant_id, file.id, file.owner_user_id)


async def new_file_audience(session: AsyncSession, file: FileRow) -> list[str]:
    """`audience` of a file made in this transaction (no share names it yet): its owner and
    everyone with a share on its folder's chain while that belongs to the same owner.

    Read once per transaction, folder and owner (`transaction_memo`): the small files a
    group commit stores together mostly go to one folder, and no unit of such a
    transaction changes a share or moves a folder. `writable_folder`'s read of the folder
    gives it already for a file of the folder's owner, the usual new file."""
    memo = transaction_memo(session, "new_file_audience")
    key = (file.tenant_id, file.parent_id, file.owner_user_id)
    users = memo.get(key)
    if users is None:
        users = memo[key] = await _audience_from(
            session, file.tenant_id, file.parent_id, file.owner_user_id
        )
    return list(users)


async def _audience_from(
    session: AsyncSession, tenant_id: str, start_id: str | None, owner: str
) -> list[str]:
    """`owner` and everyone with a share on `start_id` or a folder above it, up the chain
    while it belongs to `owner`, sorted (no start: `owner` alone)."""
    if not start_id:
        return [owner]
    return _audience_in(await _shared_chain(session, tenant_id, start_id), owner)


@dataclass(frozen=True, slots=True)
class _SharedLink:
    """One item on the way up with all its columns (`FileRow`'s, in table order) and every
    share on it (user -> role)."""

    row: tuple[Any, ...]
    shares: dict[str, str]

    @property
    def owner(self) -> str:
        return str(self.row[_OWNER])

    def link(self, user_id: str) -> Link:
        """The `Link` with `user_id`'s direct share."""
        return Link(self.row[_ID], self.row[_PARENT], self.owner, self.shares.get(user_id))


def _audience_in(links: list[_SharedLink], owner: str) -> list[str]:
    """`_audience_from` given the chain from its start, with every share on it."""
    users = {owner}
    for link in links:
        if link.owner != owner:
            break
        users.update(link.shares)
    return sorted(users)


async def _shared_chain(session: AsyncSession, tenant_id: str, file_id: str) -> list[_SharedLink]:
    """`file_id` and its folders up to the root (at most MAX_DEPTH + 1), each with all its
    columns and every share on it: one query."""
    links: list[_SharedLink] = []
    rows = await _SHARED_CHAIN.rows(session, {"tenant_id": tenant_id, "file_id": file_id})
    width = len(_FILE_COLUMNS)
    for row in rows:
        depth = row[width]
        if depth == len(links):
            links.append(_SharedLink(tuple(row[:width]), {}))
        user, role = row[width + 1], row[width + 2]
        if user is not None:
            links[-1].shares[user] = role
    return links


def _shared_chain_statement() -> Any:
    """The walk up from `:file_id` in `:tenant_id` with every column of each item and
    every share on it, by depth (built once)."""
    walk = _walk_up(_FILE_COLUMNS)
    shares = ShareRow.__table__
    return (
        select(
            *(walk.c[key] for key in _FILE_COLUMNS), walk.c.depth, shares.c.user_id, shares.c.role
        )
        .outerjoin(shares, shares.c.file_id == walk.c.id)
        .order_by(walk.c.depth)
    )


_ID, _PARENT, _OWNER = (_FILE_COLUMNS.index(k) for k in ("id", "parent_id", "owner_user_id"))
_SHARED_CHAIN = SessionStatement(_shared_chain_statement())


async def writable_folder(
    session: AsyncSession, identity: Identity, folder_id: str
) -> tuple[FileRow, str]:
    """`writable` for the folder a new file goes into, read once per transaction, caller
    and folder (`transaction_memo`): no unit of a group commit's transaction changes a
    share, an owner or a folder's place (they add files to it)."""
    memo = transaction_memo(session, "writable_folder")
    key = (identity.tenant_id, identity.user_id, folder_id)
    found = memo.get(key)
    if found is None:
        found = memo[key] = await _writable_folder(session, identity, folder_id)
    folder, role = found
    return folder, role


async def _writable_folder(
    session: AsyncSession, identity: Identity, folder_id: str
) -> tuple[FileRow, str]:
    """`writable` for `folder_id` from one read of its chain with every share on it, which
    also gives the audience of a new file of its owner there (`new_file_audience`'s memo)."""
    links = await _shared_chain(session, identity.tenant_id, folder_id) if folder_id else []
    if not links:
        raise FileNotFound("file not found", file_id=folder_id)
    folder = loaded(session, FileRow, links[0].row)
    if folder.owner_user_id == identity.user_id:
        role: str | None = OWNER
    else:
        role = role_in_chain(identity, [link.link(identity.user_id) for link in links])
    role = _may_write(folder, role)
    audiences = transaction_memo(session, "new_file_audience")
    audiences[(folder.tenant_id, folder.id, folder.owner_user_id)] = _audience_in(
        links, folder.owner_user_id
    )
    return folder, role
