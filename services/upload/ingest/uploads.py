"""Upload sessions: create (idempotent per client_request_id), read, abort, list, expire.

Status only moves forward (invariant 5): `uploading -> merging -> completed | failed`, and
`aborted` / `expired` only from `uploading`. Every move is one conditional UPDATE naming
the status it leaves, so two racing moves cannot both win.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from serentak.upload.v1 import upload_pb2
from sqlalchemy import (
    ColumnElement,
    String,
    Table,
    and_,
    bindparam,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common import audit, validation, write_behind
from services.common.auth import Identity
from services.common.db import read_only
from services.common.errors import Aborted, AlreadyExists, InvalidArgument
from services.common.jobs import ClaimedJob
from services.common.logging import get_logger
from services.common.page_tokens import PageTokens
from services.common.session_rows import insert_values, inserted, updated
from services.common.session_sql import SessionStatement
from services.upload import pagination
from services.upload.convert import STATUS_NAME
from services.upload.errors import (
    FileDeleted,
    FileNotFound,
    NotAllowed,
    UploaderNotAllowed,
    UploadNotActive,
    UploadNotFound,
)
from services.upload.files.permissions import writable, writable_role
from services.upload.files.tree import ensure_root, new_id, validate_name
from services.upload.ingest.allowance import check_allowance
from services.upload.ingest.chunk_reads import ChunkRead, ChunkReads
from services.upload.ingest.drafts import (
    Target,
    check_target,
    checked_shape,
    new_row,
    request_key_of,
)
from services.upload.models import (
    ABORTED,
    EXPIRED,
    UPLOADING,
    ChunkRow,
    FileRow,
    UploadRow,
    utcnow,
)
from services.upload.ranges import missing_ranges
from services.upload.settings import UploadSettings

_TABLE: Table = UploadRow.__table__  # type: ignore[assignment]
# The move's SET is the columns given at execution (`transition`).
_MOVE = SessionStatement(
    update(_TABLE).where(
        _TABLE.c.id == bindparam("moving_id", type_=String),
        _TABLE.c.status == bindparam("moving_from", type_=String),
    )
)
_INSERT = SessionStatement(insert(_TABLE))
_ROWS = write_behind.Rows(_INSERT)

# Legal moves (invariant 5); anything else is a bug in the caller.
_FORWARD = {
    "uploading": {"merging", "aborted", "expired"},
    "merging": {"completed", "failed"},
}

MergeEnqueuer = Callable[[AsyncSession, UploadRow], Awaitable[None]]
# Enqueues the merge already leased to the caller, who runs it at once (the inline merge),
# in the transaction that wins `merging`; None: it did not (the MergeEnqueuer's job then).
MergeClaimer = Callable[[AsyncSession, UploadRow], Awaitable[ClaimedJob | None]]

log = get_logger(__name__)


def expected_chunk_size(upload: UploadRow, index: int) -> int:
    """Bytes chunk `index` must hold: chunk_size, except the last one takes the remainder."""
    if index < upload.total_chunks - 1:
        return upload.chunk_size
    return upload.total_size - upload.chunk_size * (upload.total_chunks - 1)


async def transition(
    session: AsyncSession, upload_id: str, from_status: str, to_status: str, **values: Any
) -> bool:
    """Move `upload_id` from `from_status` to `to_status` if it is still there; True if moved.

    UPDATE uploads SET status = :to WHERE id = :id AND status = :from -- a lost race
    updates 0 rows, so exactly one of several racing callers wins.
    """
    if to_status not in _FORWARD.get(from_status, set()):
        raise ValueError(f"illegal upload transition {from_status} -> {to_status}")
    new = {"status": to_status, "updated_at": utcnow(), **values}
    where = {"moving_id": upload_id, "moving_from": from_status}
    moved = bool(await _MOVE.execute(session, {**where, **new}))
    if moved:
        # The session's copy of the row, if it holds one, shows the move (as the ORM would).
        updated(session, UploadRow, upload_id, new)
        log_transition(upload_id, from_status, to_status)
    return moved


def takes_chunks(upload: UploadRow) -> bool:
    """Whether `upload` (as read) still takes chunks: `uploading`, not past its expires_at."""
    return upload.status == UPLOADING and upload.expires_at > utcnow()


def log_transition(upload_id: str, from_status: str, to_status: str) -> None:
    """The lifecycle log line of an upload's status move. Written in the moving
    transaction (a rollback after it undoes the move), so it precedes whatever the
    commit sets off, e.g. the merge job's start."""
    log.info(
        "upload_status_changed",
        upload_id=upload_id,
        from_status=from_status,
        to_status=to_status,
        transition=f"{from_status} → {to_status}",
    )


def upload_target_id(upload: UploadRow) -> str:
    """The file an upload writes: the folder of a new file, else the file itself."""
    return upload.folder_id if upload.is_new_file else upload.file_id


async def check_uploader(
    session: AsyncSession, upload: UploadRow, *, target: FileRow | None = None
) -> str:
    """Refuse unless the upload's creator may still write its target, which still exists.

    Roles change while an upload is open (an unshare, a move out of a shared folder): the
    rights checked at CreateUpload are checked again for every chunk and, under the file
    lock, when the merge commits. UPLOADER_NOT_ALLOWED or FILE_DELETED otherwise. `target`:
    the target's row if the caller loaded it already (in the upload's tenant), saving a query.
    Returns the uploader's role on the target (on a new file's folder: its role on the file).
    """
    uploader = Identity(tenant_id=upload.tenant_id, user_id=upload.owner_user_id)
    try:
        if target is None:
            row, role = await writable(session, uploader, upload_target_id(upload))
        else:
            row = target
            role = await writable_role(session, uploader, row)
    except (FileNotFound, NotAllowed):
        raise UploaderNotAllowed(
            "the uploader may no longer write to this file", upload_id=upload.id
        ) from None
    _refuse_deleted_target(row.id, row.deleted_at)
    return role


def _refuse_deleted_target(file_id: str, deleted_at: datetime | None) -> None:
    """FILE_DELETED when the upload's target is deleted (trash): no chunk, no merge."""
    if deleted_at is not None:
        raise FileDeleted("the upload's file or folder is deleted", file_id=file_id)


@dataclass(frozen=True, slots=True)
class Prepared:
    """What `Uploads.prepare` found: a new upload's row (not stored), or `earlier` the one a
    previous try with the same client_request_id made."""

    row: UploadRow
    earlier: bool


class Uploads:
    """The upload-session use cases, scoped to the caller's tenant."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        settings: UploadSettings,
        tokens: PageTokens,
        on_finished: Callable[[str], None] = lambda upload_id: None,
    ) -> None:
        self._sessions = sessions
        self._settings = settings
        self._tokens = tokens
        # Told, after the commit, of each upload an abort or expiry here finished (it wakes
        # GetUpload calls waiting on it: finish_waits.py).
        self._on_finished = on_finished
        self._chunk_reads = ChunkReads(sessions.kw["bind"])

    async def create(
        self, identity: Identity, request: upload_pb2.CreateUploadRequest
    ) -> UploadRow:
        """A new upload (or the one an earlier try with the same client_request_id made)."""
        prepared = await self.prepare(identity, request)
        if prepared.earlier:
            return prepared.row
        try:
            async with self._sessions.begin() as session:
                await self.insert(session, identity, prepared.row)
        except IntegrityError:
            return await self.earlier(identity, request, prepared.row)
        return prepared.row

    async def prepare(
        self, identity: Identity, request: upload_pb2.CreateUploadRequest
    ) -> Prepared:
        """Everything `create` checks before its insert: the earlier upload of this
        client_request_id (`earlier`), or the new upload's row, not yet stored."""
        request_key = request_key_of(identity, request.client_request_id)
        if request_key is not None:
            existing = await self.by_request_key(request_key)
            if existing is not None:
                return Prepared(await self._same_request(identity, existing, request), True)
        row = await self.draft(identity, request)
        # Pure reads (no write lock on SQLite): the commit checks again in its transaction.
        async with self._sessions() as session:
            await read_only(session)
            await check_target(session, identity, row)
        return Prepared(row, False)

    async def draft(self, identity: Identity, request: upload_pb2.CreateUploadRequest) -> UploadRow:
        """The new upload's row after the checks that need no database read (the request's
        shape, size, ids and name), its target checked later by `check_target` in the
        transaction that stores it. A new file's folder and name are the request's; a new
        version's are filled in by `check_target`."""
        request_key = request_key_of(identity, request.client_request_id)
        algorithm, expected = checked_shape(self._settings, request)
        which = request.WhichOneof("target")
        if which == "new_file":
            name = validate_name(request.new_file.name, "new_file.name")
            validation.resource_id(request.new_file.folder_id, "new_file.folder_id", required=False)
            folder_id = request.new_file.folder_id or await ensure_root(self._sessions, identity)
            target = Target(new_id(), folder_id, name, True)
        elif which == "file_id":
            validation.resource_id(request.file_id, "file_id")
            target = Target(request.file_id, "", "", False)
        else:
            raise InvalidArgument("target", "set new_file or file_id")
        return new_row(self._settings, identity, request, request_key, algorithm, expected, target)

    async def allow(self, session: AsyncSession, identity: Identity, row: UploadRow) -> None:
        """Check the user's open-upload cap and the tenant's quota for `row`, in the
        caller's transaction (`insert` does, unless told it was done)."""
        await check_allowance(session, self._settings, identity, row.total_size)

    async def insert(
        self,
        session: AsyncSession,
        identity: Identity,
        row: UploadRow,
        *,
        allowed: bool = False,
        kept: bool = True,
    ) -> None:
        """Store a prepared upload in the caller's transaction, within the user's open-upload
        cap and the tenant's quota (`allowed`: `allow` checked them in it already);
        IntegrityError when its client_request_id was stored meanwhile (then `earlier`
        finds that one). In a group commit the row is written behind (`write_behind`), with
        the other units' rows, and so is its IntegrityError. `kept`: `row` becomes the
        session's object for its id (not for a caller whose transaction never reads it back
        through the session: `versions.add_file`)."""
        if not allowed:
            await self.allow(session, identity, row)
        await write_behind.write(session, _ROWS, insert_values(row))
        if kept:
            inserted(session, row)

    async def earlier(
        self, identity: Identity, request: upload_pb2.CreateUploadRequest, row: UploadRow
    ) -> UploadRow:
        """The upload a concurrent try with `row`'s client_request_id stored first."""
        existing = await self.earlier_if_any(identity, request, row)
        if existing is None:
            # Not a duplicate request id (its row is gone again, or the conflict was
            # another's): the request may simply be retried.
            raise Aborted(f"upload {row.id} could not be stored; retry", reason="UPLOAD_CONFLICT")
        return existing

    async def earlier_if_any(
        self, identity: Identity, request: upload_pb2.CreateUploadRequest, row: UploadRow
    ) -> UploadRow | None:
        """The upload stored under `row`'s client_request_id, if any: the same request's
        (CLIENT_REQUEST_ID_REUSED if it was another request)."""
        if row.request_key is None:
            return None
        existing = await self.by_request_key(row.request_key)
        if existing is None:
            return None
        return await self._same_request(identity, existing, request)

    async def by_request_key(self, key: str) -> UploadRow | None:
        """The upload stored under `key` (tenant:user:client_request_id), if any."""
        async with self._sessions() as session:
            await read_only(session)
            return (
                await session.execute(select(UploadRow).where(UploadRow.request_key == key))
            ).scalar_one_or_none()

    async def _same_request(
        self, identity: Identity, existing: UploadRow, request: upload_pb2.CreateUploadRequest
    ) -> UploadRow:
        """The earlier upload of this client_request_id, if the request asks for the same one.

        A retry must name the same target (new name in the same folder, or the same file)
        and the same layout; anything else is CLIENT_REQUEST_ID_REUSED, so a client never
        gets another upload's result back for a different file.
        """
        same = (
            existing.total_chunks == request.total_chunks
            and existing.total_size == request.total_size
            and existing.chunk_size == request.chunk_size
            and await self._same_target(identity, existing, request)
        )
        if not same:
            raise AlreadyExists(
                "client_request_id was used for a different upload",
                reason="CLIENT_REQUEST_ID_REUSED",
                upload_id=existing.id,
            )
        return existing

    async def _same_target(
        self, identity: Identity, existing: UploadRow, request: upload_pb2.CreateUploadRequest
    ) -> bool:
        which = request.WhichOneof("target")
        if which == "file_id":
            return not existing.is_new_file and existing.file_id == request.file_id
        if which != "new_file" or not existing.is_new_file:
            return False
        name = validate_name(request.new_file.name, "new_file.name")
        folder_id = request.new_file.folder_id
        if not folder_id:
            folder_id = await ensure_root(self._sessions, identity)
        return existing.name == name and existing.folder_id == folder_id

    async def load(self, session: AsyncSession, identity: Identity, upload_id: str) -> UploadRow:
        """The caller's upload `upload_id` in their tenant, or UPLOAD_NOT_FOUND."""
        row = (
            await session.execute(select(UploadRow).where(*_callers(identity, upload_id)))
        ).scalar_one_or_none()
        if row is None:
            raise UploadNotFound("upload not found", upload_id=upload_id)
        return row

    async def read_for_chunk(self, identity: Identity, upload_id: str, index: int) -> ChunkRead:
        """The caller's upload `upload_id` (UPLOAD_NOT_FOUND otherwise), checked for its
        uploader's rights (`check_uploader`), and the row stored for chunk `index`: a
        chunk's hot path, one statement (`chunk_reads`).

        When the uploader owns the target (the common case) the read has answered the
        rights check already: an owner may write, so only a deleted target refuses. Any
        other case (a shared target, or one gone from the tenant) runs the full check,
        which names the error."""
        _check_upload_id(upload_id)
        found = await self._chunk_reads.read(identity, upload_id, index)
        if found is None:
            raise UploadNotFound("upload not found", upload_id=upload_id)
        upload, target = found.upload, found.target
        if target is not None and target.owner_user_id == upload.owner_user_id:
            _refuse_deleted_target(target.id, target.deleted_at)
            return found
        async with self._sessions() as session:
            await read_only(session)
            await check_uploader(session, upload)
        return found

    async def close(self) -> None:
        """Return the chunk reader's connection (service shutdown)."""
        await self._chunk_reads.close()

    async def expire_if_due(self, upload: UploadRow) -> UploadRow:
        """Move an idle `uploading` upload past its expires_at to `expired`; the fresh row."""
        if upload.status != UPLOADING or takes_chunks(upload):
            return upload
        async with self._sessions.begin() as session:
            expired = await transition(session, upload.id, UPLOADING, EXPIRED)
        if expired:
            self._on_finished(upload.id)
        async with self._sessions() as session:
            fresh = await session.get(UploadRow, upload.id)
            assert fresh is not None
            return fresh

    async def get(
        self, identity: Identity, upload_id: str
    ) -> tuple[UploadRow, list[tuple[int, int]]]:
        """The upload and its missing index ranges (pure reads: no SQLite write lock)."""
        async with self._sessions() as session:
            await read_only(session)
            upload = await self.load(session, identity, upload_id)
        upload = await self.expire_if_due(upload)
        async with self._sessions() as session:
            await read_only(session)
            indexes = (
                await session.execute(
                    select(ChunkRow.chunk_index).where(ChunkRow.upload_id == upload.id)
                )
            ).scalars()
            return upload, missing_ranges(upload.total_chunks, indexes)

    async def abort(self, identity: Identity, upload_id: str) -> UploadRow:
        """Abort an `uploading` upload; any other status is UPLOAD_NOT_ACTIVE."""
        async with self._sessions() as session:
            upload = await self.load(session, identity, upload_id)
        upload = await self.expire_if_due(upload)
        async with self._sessions.begin() as session:
            moved = await transition(session, upload.id, UPLOADING, ABORTED)
            if moved:
                await audit.record(
                    session,
                    tenant_id=upload.tenant_id,
                    principal=audit.principal_of(identity),
                    action="upload.aborted",
                    target_type="upload",
                    target_id=upload.id,
                    detail={"file_id": upload.file_id, "name": upload.name},
                )
        if moved:
            self._on_finished(upload.id)
        async with self._sessions() as session:
            fresh = await session.get(UploadRow, upload.id)
            assert fresh is not None
        if not moved:
            raise UploadNotActive(
                f"cannot abort an upload that is {fresh.status}",
                upload_id=upload.id,
                status=fresh.status,
            )
        return fresh

    async def list(
        self, identity: Identity, request: upload_pb2.ListUploadsRequest
    ) -> tuple[list[UploadRow], str]:
        """The caller's uploads (or all uploads of a file they can write), newest last."""
        size = pagination.page_size(request.page_size)
        # Bound to the listing asked for: the caller's own uploads, or one file's.
        purpose = f"ListUploads:{request.file_id}:{request.status}"
        position = self._tokens.decode(request.page_token, purpose, 2)
        query = select(UploadRow).where(UploadRow.tenant_id == identity.tenant_id)
        async with self._sessions() as session:
            if request.file_id:
                await writable(session, identity, request.file_id)
                query = query.where(UploadRow.file_id == request.file_id)
            else:
                query = query.where(UploadRow.owner_user_id == identity.user_id)
            if request.status:
                if request.status not in STATUS_NAME:
                    raise InvalidArgument("status", f"unknown upload status {request.status}")
                query = query.where(UploadRow.status == STATUS_NAME[request.status])
            if position is not None:
                at = datetime.fromisoformat(str(position[0]))
                query = query.where(
                    or_(
                        UploadRow.created_at > at,
                        and_(UploadRow.created_at == at, UploadRow.id > str(position[1])),
                    )
                )
            rows = list(
                (
                    await session.execute(
                        query.order_by(UploadRow.created_at, UploadRow.id).limit(size + 1)
                    )
                ).scalars()
            )
        token = ""
        if len(rows) > size:
            rows = rows[:size]
            last = rows[-1]
            token = self._tokens.encode(purpose, [last.created_at.isoformat(), last.id])
        return rows, token


def _callers(identity: Identity, upload_id: str) -> tuple[ColumnElement[bool], ...]:
    """The conditions that find `upload_id` only among the caller's own uploads in their
    tenant (after checking the id's shape)."""
    _check_upload_id(upload_id)
    return (
        UploadRow.id == upload_id,
        UploadRow.tenant_id == identity.tenant_id,
        UploadRow.owner_user_id == identity.user_id,
    )


def _check_upload_id(upload_id: str) -> None:
    """Refuse an empty or malformed upload id before any statement."""
    if not upload_id:
        raise InvalidArgument("upload_id", "must not be empty")
    validation.resource_id(upload_id, "upload_id")
