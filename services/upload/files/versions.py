"""Committing a file change: bump the monotonic version, check fencing or expected_version.

Invariant 6: every metadata change bumps `files.version` in the transaction that also
writes the change's outbox event (the caller records the event in the same session).
Invariant 7, fencing: storage, not the lock, has the last word. A lock can be lost without
its holder noticing in time (a GC pause, a stalled disk, a partition longer than the TTL);
the next holder's token (an etcd revision) is strictly greater. So a content commit made
under the file lock carries the lock's token, and the UPDATE itself refuses a token lower
than `last_lock_token` (equal: the same holder writing again). This is the one fencing check:
every commit under a lock goes through `commit_fenced`.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import String, Table, bindparam, insert, update
from sqlalchemy.ext.asyncio import AsyncSession

from services.common import write_behind
from services.common.session_rows import insert_values, inserted, refreshed, updated
from services.common.session_sql import Later, SessionStatement
from services.upload.errors import FileNotFound, StaleFencingToken, VersionMismatch
from services.upload.models import FileRow, utcnow


async def _reload(session: AsyncSession, file_id: str) -> FileRow | None:
    return await session.get(FileRow, file_id, populate_existing=True)


async def bump(
    session: AsyncSession, file: FileRow, expected_version: int, **values: Any
) -> FileRow:
    """Apply `values` and `version = version + 1`; ABORTED/VERSION_MISMATCH on a stale expectation.

    UPDATE files SET ..., version = version + 1
     WHERE id = :id AND (:expected = 0 OR version = :expected)
    """
    stmt = update(FileRow).where(FileRow.id == file.id)
    if expected_version:
        stmt = stmt.where(FileRow.version == expected_version)
    result = await session.execute(
        stmt.values(version=FileRow.version + 1, updated_at=utcnow(), **values)
    )
    fresh = await _reload(session, file.id)
    if fresh is None:
        raise FileNotFound("file not found", file_id=file.id)
    if not result.rowcount:  # type: ignore[attr-defined]
        raise VersionMismatch(
            f"the file is at version {fresh.version}, not {expected_version}",
            file_id=file.id,
            expected_version=expected_version,
            current_version=fresh.version,
        )
    return fresh


async def commit_fenced(session: AsyncSession, file_id: str, token: int, **values: Any) -> FileRow:
    """Apply a content change under lock `token`; ABORTED/STALE_FENCING_TOKEN if stale.

    UPDATE files SET ..., version = version + 1, last_lock_token = :token
     WHERE id = :id AND last_lock_token <= :token   -- equal: the same holder again
    """
    row = await _FENCED.first(
        session, {"fenced_id": file_id, "token": token, "updated_at": utcnow(), **values}
    )
    if row is not None:
        return refreshed(session, FileRow, row)
    fresh = await _reload(session, file_id)
    if fresh is None:
        raise FileNotFound("file not found", file_id=file_id)
    raise StaleFencingToken(
        f"lock token {token} is older than the file's {fresh.last_lock_token}",
        file_id=file_id,
        token=token,
        last_lock_token=fresh.last_lock_token,
    )


async def add_file(session: AsyncSession, file: FileRow, *, kept: bool = True) -> None:
    """Insert the new `file` (its first version) in `session`'s transaction; it is then
    the session's row for its id (IntegrityError if its id is taken), unless not `kept`:
    for a caller whose transaction never reads it back through the session (the ORM's
    bookkeeping of a row is ~5% of a small file's CPU). In a group commit the row is
    written behind (`write_behind`), with the other units' rows; until then the name check
    sees it through `pending_file_named`."""
    await write_behind.write(session, _FILE_ROWS, insert_values(file))
    if kept:
        inserted(session, file)


def pending_file_named(
    session: AsyncSession, tenant_id: str, parent_id: str, name: str, except_id: str = ""
) -> str | None:
    """The id of a new file named `name` in folder `parent_id` that this transaction has
    added and not written yet (a group commit's, written behind), if any."""
    for row in write_behind.pending(session, _FILE_ROWS):
        if (
            row["name"] == name
            and row["parent_id"] == parent_id
            and row["tenant_id"] == tenant_id
            and row["id"] != except_id
        ):
            return str(row["id"])
    return None


def pending_file_bytes(session: AsyncSession, tenant_id: str) -> int:
    """The bytes of the new files of `tenant_id` this transaction has added and not written
    yet (a group commit's, written behind): the tenant's stored bytes (its usage row, kept
    by triggers on the files table) count them only once they are written, so the quota
    check of the group's next unit adds them itself."""
    return sum(
        int(row["size"] or 0)
        for row in write_behind.pending(session, _FILE_ROWS)
        if row["tenant_id"] == tenant_id
    )


async def touch_folder(session: AsyncSession, folder_id: str | None) -> None:
    """Bump a folder's children_version: its cached listings are now outdated. In a group
    commit the bump is written behind (`write_behind`): once per folder for the group."""
    if folder_id:
        await write_behind.write(session, _BUMPS, folder_id)


class _FolderBumps:
    """Bumps each folder named once, in key order (their rows' locks)."""

    async def write(self, session: AsyncSession, items: list[str]) -> None:
        for folder_id in sorted(set(items)):
            answer = await _TOUCH.later(session, {"folder_id": folder_id})
            # The session's copy of the folder, if any, shows it once answered (the rest of
            # the writes go on meanwhile).
            await write_behind.when_answered(
                session, functools.partial(_show_bump, session, folder_id, answer)
            )


async def _show_bump(session: AsyncSession, folder_id: str, answer: Later) -> None:
    row = await answer.first()
    if row is not None:
        updated(session, FileRow, folder_id, {"children_version": row[0]})


_BUMPS = _FolderBumps()
_FILES: Table = FileRow.__table__  # type: ignore[assignment]
# Built once (values passed at execution).
_INSERT_FILE = SessionStatement(insert(_FILES))
_FILE_ROWS = write_behind.Rows(_INSERT_FILE)
_TOUCH = SessionStatement(
    update(_FILES)
    .where(_FILES.c.id == bindparam("folder_id", type_=String))
    .values(children_version=_FILES.c.children_version + 1)
    .returning(_FILES.c.children_version)
)
# The one fencing check (module docstring); its SET: the token, the version bump and the
# columns given at execution.
_FENCED = SessionStatement(
    update(_FILES)
    .where(
        _FILES.c.id == bindparam("fenced_id", type_=String),
        _FILES.c.last_lock_token <= bindparam("token"),
    )
    .values(version=_FILES.c.version + 1, last_lock_token=bindparam("token"))
    .returning(*_FILES.c)
)
