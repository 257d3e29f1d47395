"""The folder tree's basics: names, each user's root folder, new ids, the tree lock.

Names are NFC-normalised and unique among the live (not deleted) items of one folder.
"""

from __future__ import annotations

import unicodedata
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, func, literal, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common import group_reads
from services.common.auth import Identity
from services.common.db import read_only
from services.common.errors import AlreadyExists, FailedPrecondition, InvalidArgument
from services.common.group_commit import shares_transaction
from services.common.session_sql import SessionStatement, SessionStatements
from services.upload.files.permissions import role_of
from services.upload.files.versions import pending_file_named
from services.upload.files.visibility import rule_count, visible
from services.upload.models import FOLDER, FileRow, utcnow

# pg_advisory_xact_lock(namespace, hashtext(tenant)): the namespace keeps the tree lock
# apart from any other advisory lock.
_TREE_LOCK_NAMESPACE = 0x7EEE

MAX_NAME_LENGTH = 255


def new_id() -> str:
    """A fresh random id (32 hex characters)."""
    return uuid.uuid4().hex


def validate_name(name: str, field: str = "name") -> str:
    """A usable file or folder name (NFC-normalised), or INVALID_ARGUMENT naming `field`."""
    name = unicodedata.normalize("NFC", name)
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


# Root folder ids by database (its engine) and root key; bounded (cleared when full).
_ROOTS: weakref.WeakKeyDictionary[object, dict[str, str]] = weakref.WeakKeyDictionary()
_ROOTS_MAX = 100_000


async def find_root(session: AsyncSession, identity: Identity) -> FileRow | None:
    """The caller's root folder if it exists."""
    return (
        await session.execute(select(FileRow).where(FileRow.root_of == root_key(identity)))
    ).scalar_one_or_none()


async def ensure_root(sessions: async_sessionmaker[AsyncSession], identity: Identity) -> str:
    """The id of the caller's root folder, created on first use (race-safe).

    Remembered per database once seen: a root is never moved, deleted or replaced."""
    known = _ROOTS.setdefault(sessions.kw.get("bind") or sessions, {})
    key = root_key(identity)
    if (root_id := known.get(key)) is not None:
        return root_id
    root_id = await _find_or_create_root(sessions, identity)
    if len(known) >= _ROOTS_MAX:
        known.clear()
    known[key] = root_id
    return root_id


async def _find_or_create_root(
    sessions: async_sessionmaker[AsyncSession], identity: Identity
) -> str:
    async with sessions() as session:
        await read_only(session)
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
            await read_only(session)
            found = await find_root(session, identity)
            assert found is not None
            return found.id


class NameTaken(AlreadyExists):
    """A live item of the folder already has this name."""

    reason = "NAME_TAKEN"


class TreeTooDeep(FailedPrecondition):
    """The change would nest folders deeper than the tree allows."""

    reason = "TREE_TOO_DEEP"


async def lock_tree(session: AsyncSession, tenant_id: str) -> None:
    """Serialise the tenant's tree changes (moves, names, the change log) until this
    transaction ends.

    Call first in the transaction, before any row is written or locked: the one lock order
    (tree lock, then rows) is what keeps two changes of a tenant from deadlocking (one
    holding a folder row and waiting for the tree lock, the other the reverse). On
    PostgreSQL a transaction that has written already and does not hold the lock yet is
    refused (`TreeLockOrder`, a bug), so a wrong order fails every test that takes the
    path, not one run in a hundred. In a unit of a group commit (a transaction the group's
    units share, each unit in a savepoint or not) the lock is taken whatever came before:
    the group runs its units sorted by tenant (services/common/group_commit.py). SQLite
    needs nothing: every transaction begins IMMEDIATE, so writers are serialised already.
    """
    if session.get_bind().dialect.name != "postgresql":
        return
    sync = session.sync_session
    current = sync.get_nested_transaction() or sync.get_transaction()
    if _taken_in_line(session, tenant_id, current):
        return
    strict = not (session.in_nested_transaction() or shares_transaction(session))
    params = {"ns": _TREE_LOCK_NAMESPACE, "tenant": tenant_id, "strict": strict}
    held, wrote, _ = await _TAKE_TREE_LOCK.one(session, params)
    if strict and wrote and not held:
        raise TreeLockOrder(
            f"tree lock of tenant {tenant_id!r} taken after this transaction wrote rows"
        )
    session.info.setdefault(_TAKEN, {})[tenant_id] = current


# session.info: tenant -> the (nested) transaction that took its tree lock. A use case asks
# for the lock at each step that needs it (its unit, the commit, the change log); once taken
# in this transaction or a savepoint around the current one, asking again costs no round
# trip. A rolled-back savepoint gives back the lock it took, and is no longer in line.
_TAKEN = "serentak.tree_locks"


def _taken_in_line(session: AsyncSession, tenant_id: str, current: Any) -> bool:
    """Whether `tenant_id`'s tree lock was taken by `current` or a transaction around it."""
    taker = session.info.get(_TAKEN, {}).get(tenant_id)
    while taker is not None and current is not None:
        if current is taker:
            return bool(taker.is_active)
        current = current.parent
    return False


# One round trip: whether the lock is held already (pg_locks shows a two-key advisory lock
# as classid, objid, objsubid=2) and whether the transaction wrote (it has an id once it
# has written or locked a row); the lock is taken unless that would break the order (held
# already, taking it again is a no-op until the transaction ends; `strict`: not in a
# savepoint, see `lock_tree`).
_TAKE_TREE_LOCK_SQL = text(
    "WITH state AS (SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'"
    " AND pid = pg_backend_pid() AND granted AND objsubid = 2"
    " AND classid = CAST(:ns AS oid) AND objid = CAST(hashtext(:tenant) AS oid)) AS held,"
    " pg_current_xact_id_if_assigned() IS NOT NULL AS wrote)"
    " SELECT held, wrote, CASE WHEN held OR NOT wrote OR NOT :strict"
    " THEN pg_advisory_xact_lock(:ns, hashtext(:tenant)) IS NULL END FROM state"
)
_TAKE_TREE_LOCK = SessionStatement(_TAKE_TREE_LOCK_SQL)


class TreeLockOrder(RuntimeError):
    """A transaction asked for the tree lock after writing rows: a bug in the caller's
    order (see `lock_tree`), refused before it can deadlock."""


async def name_holder(
    session: AsyncSession, tenant_id: str, parent_id: str, name: str, except_id: str = ""
) -> str | None:
    """The id of the live item named `name` in folder `parent_id`, if any. In a group
    commit, read with the names the next units check (`group_reads`, `NAME_HOLDERS`)."""
    # A new file of this transaction not written yet (a group commit's) holds it too.
    waiting = pending_file_named(session, tenant_id, parent_id, name, except_id)
    if waiting is not None:
        return waiting
    holder: str | None = await group_reads.read(
        session, NAME_HOLDERS, (tenant_id, parent_id, name, except_id)
    )
    return holder


class _NameHolders:
    """The name check's read for many names: (tenant, folder, name, except_id) -> the id
    of the live item so named, or None. It answers for the first key's tenant only: its
    tree lock, which the caller holds (`lock_tree`), is what keeps the answers current
    until the transaction ends (every change of a name or a folder's items takes it)."""

    def __init__(self) -> None:
        self._built: tuple[int, SessionStatements] | None = None

    async def read(
        self, session: AsyncSession, keys: Sequence[tuple[str, str, str, str]]
    ) -> dict[tuple[str, str, str, str], str | None]:
        tenant_id = keys[0][0]
        names: dict[tuple[str, str], list[str]] = {}
        for tenant, parent_id, name, except_id in keys:
            if tenant == tenant_id:
                names.setdefault((parent_id, except_id), []).append(name)
        found: dict[tuple[str, str, str, str], str | None] = {}
        for (parent_id, except_id), asked in names.items():
            values: dict[str, Any] = {
                "tenant_id": tenant_id,
                "parent_id": parent_id,
                "except_id": except_id,
                **{f"name_{i}": name for i, name in enumerate(asked)},
            }
            statement = self._statements().of_padded(values, ("name",), len(asked))
            holders: dict[str, str] = {}
            for name, file_id in await statement.rows(session, values):
                holders.setdefault(name, str(file_id))
            for name in asked:
                found[(tenant_id, parent_id, name, except_id)] = holders.get(name)
        return found

    def _statements(self) -> SessionStatements:
        """Built once per set of hiding rules (rules register at import)."""
        rules = rule_count()
        if self._built is None or self._built[0] != rules:
            self._built = (rules, SessionStatements(_name_holders_of))
        return self._built[1]


def _name_holders_of(count: int) -> Any:
    """The live, visible items of `:parent_id` named one of `:name_0..` (count names)."""
    files = FileRow.__table__.c
    return select(files.name, files.id).where(
        files.tenant_id == bindparam("tenant_id"),
        files.parent_id == bindparam("parent_id"),
        files.name.in_([bindparam(f"name_{i}") for i in range(count)]),
        files.deleted_at.is_(None),
        files.id != bindparam("except_id"),
        visible(files.id, files.tenant_id),
    )


NAME_HOLDERS = _NameHolders()


async def require_free_name(
    session: AsyncSession,
    identity: Identity,
    parent_id: str,
    name: str,
    field: str,
    except_id: str = "",
) -> None:
    """ALREADY_EXISTS / NAME_TAKEN if a live item of the folder has `name`.

    The holder's id is named when the caller may see it (an item of another owner in a
    shared folder stays unrevealed).
    """
    holder = await name_holder(session, identity.tenant_id, parent_id, name, except_id)
    if holder is None:
        return
    row = await session.get(FileRow, holder)
    visible = row is not None and await role_of(session, identity, row) is not None
    raise NameTaken(
        f"{field}: the folder already has an item named {name!r}",
        field=field,
        existing_file_id=holder if visible else None,
    )


async def free_name(session: AsyncSession, tenant_id: str, parent_id: str, name: str) -> str:
    """`name`, or `name (2)`, `name (3)`... (before the extension): the first one not taken."""
    stem, dot, ext = name.rpartition(".")
    if not stem:
        stem, dot, ext = name, "", ""
    candidate, n = name, 1
    while await name_holder(session, tenant_id, parent_id, candidate) is not None:
        n += 1
        # Past a hundred copies, a random tag ends the search in one more step.
        tag = str(n) if n <= 100 else new_id()[:12]
        suffix = f" ({tag}){dot}{ext}"
        candidate = stem[: MAX_NAME_LENGTH - len(suffix)] + suffix
    return candidate


async def folder_height(session: AsyncSession, folder_id: str, limit: int) -> int:
    """How many levels of folders lie below `folder_id` (0: none), counting up to `limit`."""
    files = FileRow.__table__
    start = (
        select(files.c.id, literal(0).label("level"))
        .where(files.c.id == folder_id)
        .cte("below", recursive=True)
    )
    down = files.alias("down")
    walk = start.union_all(
        select(down.c.id, start.c.level + 1).where(
            down.c.parent_id == start.c.id, down.c.kind == FOLDER, start.c.level < limit
        )
    )
    return int(await session.scalar(select(func.max(walk.c.level))) or 0)
