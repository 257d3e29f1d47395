"""A new upload's row, before it is stored: the checks a request passes without reading
the database (its shape, size, checksum, ids and name), and `check_target`, the target's
checks in the transaction that stores the row.

CreateUpload runs the target's checks in a read before its insert (`Uploads.prepare`);
UploadFile runs them in its one committing transaction (`Uploads.draft` + `check_target`),
so a small file costs no read transaction of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from serentak.upload.v1 import upload_pb2
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.auth import Identity
from services.common.errors import InvalidArgument
from services.common.session_rows import new_object
from services.upload import checksums
from services.upload.errors import FileDeleted, WrongKind
from services.upload.files.permissions import writable, writable_folder
from services.upload.files.tree import new_id, require_free_name
from services.upload.ingest.allowance import check_size
from services.upload.models import FILE, FOLDER, UPLOADING, FileRow, UploadRow, utcnow
from services.upload.settings import UploadSettings

MAX_CLIENT_REQUEST_ID = 128


@dataclass(frozen=True, slots=True)
class Target:
    """Where an upload writes: a new file (`is_new`, named `name` in `folder_id`) or a new
    version of `file_id` (folder and name "" until its row is read)."""

    file_id: str
    folder_id: str
    name: str
    is_new: bool


def request_key_of(identity: Identity, crid: str) -> str | None:
    """The upload's unique key for `crid` (tenant:user:client_request_id), None without one."""
    if len(crid) > MAX_CLIENT_REQUEST_ID or (crid and not crid.isprintable()):
        raise InvalidArgument(
            "client_request_id", f"at most {MAX_CLIENT_REQUEST_ID} printable characters"
        )
    return f"{identity.tenant_id}:{identity.user_id}:{crid}" if crid else None


def validate_shape(
    settings: UploadSettings, total_chunks: int, total_size: int, chunk_size: int
) -> None:
    """Check the chunk layout: counts, bounds, and that the sizes add up."""
    if not 1 <= total_chunks <= settings.max_total_chunks:
        raise InvalidArgument("total_chunks", f"must be 1..{settings.max_total_chunks}")
    if chunk_size < 1 or chunk_size > settings.max_chunk_size:
        raise InvalidArgument("chunk_size", f"must be 1..{settings.max_chunk_size} bytes")
    if total_chunks > 1 and chunk_size < settings.min_chunk_size:
        raise InvalidArgument(
            "chunk_size",
            f"must be at least {settings.min_chunk_size} bytes for a multi-chunk upload",
        )
    if total_size < 0:
        raise InvalidArgument("total_size", "must not be negative")
    # Every chunk but the last is full; the last holds 1..chunk_size bytes (0 for an empty file).
    low = chunk_size * (total_chunks - 1) + (1 if total_chunks > 1 else 0)
    high = chunk_size * total_chunks
    if not low <= total_size <= high:
        raise InvalidArgument(
            "total_size",
            f"{total_chunks} chunks of {chunk_size} bytes hold {low}..{high} bytes",
        )


def checked_shape(
    settings: UploadSettings, request: upload_pb2.CreateUploadRequest
) -> tuple[str, str]:
    """The request's layout, size and checksum fields checked: (algorithm, expected)."""
    validate_shape(settings, request.total_chunks, request.total_size, request.chunk_size)
    check_size(settings, request.total_size)
    algorithm = checksums.algorithm_name(request.checksum_algorithm)
    expected = ""
    if request.expected_checksum:
        expected = checksums.normalize_hex(
            request.expected_checksum, algorithm, "expected_checksum"
        )
    return algorithm, expected


def new_row(
    settings: UploadSettings,
    identity: Identity,
    request: upload_pb2.CreateUploadRequest,
    request_key: str | None,
    algorithm: str,
    expected: str,
    target: Target,
) -> UploadRow:
    """A new `uploading` upload's row (not stored)."""
    now = utcnow()
    # Built without the constructor's per-attribute events (`new_object`): every upload's.
    return new_object(
        UploadRow,
        dict(
            id=new_id(),
            tenant_id=identity.tenant_id,
            owner_user_id=identity.user_id,
            request_key=request_key,
            client_request_id=request.client_request_id,
            file_id=target.file_id,
            is_new_file=target.is_new,
            folder_id=target.folder_id,
            name=target.name,
            status=UPLOADING,
            total_chunks=request.total_chunks,
            total_size=request.total_size,
            chunk_size=request.chunk_size,
            checksum_algorithm=algorithm,
            expected_checksum=expected,
            received_chunk_count=0,
            created_at=now,
            updated_at=now,
            expires_at=now + timedelta(seconds=settings.upload_ttl_seconds),
            file_version=0,
            final_checksum="",
            failure_reason="",
            # Every column set: a status move's UPDATE then sets its values on the object too.
            merge_started_at=None,
            merge_finished_at=None,
        ),
    )


def _check_new_file_folder(folder: FileRow) -> None:
    """A new file's folder must be a live folder."""
    if folder.kind != FOLDER:
        raise WrongKind("new_file.folder_id is not a folder", file_id=folder.id)
    if folder.deleted_at is not None:
        raise FileDeleted("the folder is deleted", file_id=folder.id)


def _check_version_target(file: FileRow) -> None:
    """A new version's target must be a live file."""
    if file.kind != FILE:
        raise WrongKind("file_id is a folder", file_id=file.id)
    if file.deleted_at is not None:
        raise FileDeleted("the file is deleted", file_id=file.id)


async def check_target(
    session: AsyncSession, identity: Identity, row: UploadRow
) -> tuple[FileRow, str]:
    """In the caller's transaction: the caller may write `row`'s target (a live folder for a
    new file, whose name is free there; else a live file, whose folder and name go into
    `row`), with CreateUpload's errors. Returns the target's row and the caller's role on it."""
    if row.is_new_file:
        folder, role = await writable_folder(session, identity, row.folder_id)
        _check_new_file_folder(folder)
        await require_free_name(session, identity, row.folder_id, row.name, "new_file.name")
        return folder, role
    file, role = await writable(session, identity, row.file_id)
    _check_version_target(file)
    row.folder_id, row.name = file.parent_id or "", file.name
    return file, role
