"""A file's version history: its content versions, and which bytes a Download reads.

A content version is a completed upload of the file (`uploads.status = completed`, made by
the merge, UploadFile or RestoreVersion). Its number is the file version it committed
(`uploads.file_version`; the numbers between two content versions were metadata changes),
its bytes are `files/{file_id}/{upload_id}`, and its author the upload's creator. The
storage lifecycle deletes a superseded version's bytes once it is outside the newest
`version_keep_count` and older than `version_keep_days` (`storage/lifecycle/sweep.py`,
step 3) and stamps `content_purged_at`; the entry stays. So a version is *kept* while
`content_purged_at` is NULL, a kept version is readable, and one past retention answers
FAILED_PRECONDITION / VERSION_PURGED, distinct from NOT_FOUND / VERSION_NOT_FOUND for a
number the file never had. The current content is never purged.

Who may do what is `permissions.py`'s: whoever reads the file reads its history (viewers
included); another tenant's file id is FILE_NOT_FOUND.
"""

from __future__ import annotations

from dataclasses import dataclass

from serentak.upload.v1 import upload_pb2
from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common import validation
from services.common.auth import Identity
from services.common.db import read_only
from services.common.errors import InvalidArgument
from services.common.page_tokens import PageTokens
from services.upload import checksums
from services.upload.convert import file_message, timestamp
from services.upload.errors import VersionNotFound, VersionPurged, WrongKind
from services.upload.files.permissions import readable
from services.upload.files.visibility import raise_if_hidden
from services.upload.models import COMPLETED, FILE, FileRow, UploadRow
from services.upload.pagination import page_size
from services.upload.storage.blob_store import content_key

_PURPOSE = "versions"


@dataclass(frozen=True, slots=True)
class Content:
    """The bytes of one version to read: where they are and what they must hash to.
    `version` is 0 when no upload row names the content (a file synced from upstream)."""

    key: str
    version: int
    size: int
    checksum: str
    checksum_algorithm: str


def is_current(file: FileRow, upload: UploadRow) -> bool:
    """True if `upload`'s bytes are the file's content now."""
    return file.blob_key == content_key(file.id, upload.id)


def version_message(file: FileRow, upload: UploadRow) -> upload_pb2.FileVersion:
    """The FileVersion entry of one completed upload of `file`."""
    msg = upload_pb2.FileVersion(
        version=upload.file_version,
        size=upload.total_size,
        checksum=upload.final_checksum,
        checksum_algorithm=checksums.algorithm_enum(upload.checksum_algorithm),
        author_user_id=upload.owner_user_id,
        current=is_current(file, upload),
        kept=upload.content_purged_at is None,
        upload_id=upload.id,
    )
    made = timestamp(upload.merge_finished_at)
    if made is not None:
        msg.created_at.CopyFrom(made)
    return msg


def _content_versions(file_id: str) -> Select[UploadRow]:
    return select(UploadRow).where(UploadRow.file_id == file_id, UploadRow.status == COMPLETED)


async def find_version(
    session: AsyncSession, file: FileRow, version: int, *, kept: bool = True
) -> UploadRow:
    """The completed upload that committed content version `version` of `file`;
    VERSION_NOT_FOUND for a number it never had, VERSION_PURGED past retention (unless
    `kept` is False: the entry whatever became of its bytes)."""
    upload = (
        await session.execute(_content_versions(file.id).where(UploadRow.file_version == version))
    ).scalar_one_or_none()
    if upload is None:
        raise VersionNotFound(
            f"the file has no content version {version}; ListVersions lists them",
            file_id=file.id,
            version=version,
        )
    if kept and upload.content_purged_at is not None:
        raise VersionPurged(
            f"version {version}'s content was deleted by the retention policy",
            file_id=file.id,
            version=version,
            purged_at=upload.content_purged_at.isoformat(),
        )
    return upload


def content_of(upload: UploadRow) -> Content:
    """The bytes `upload` committed."""
    return Content(
        key=content_key(upload.file_id, upload.id),
        version=upload.file_version,
        size=upload.total_size,
        checksum=upload.final_checksum,
        checksum_algorithm=upload.checksum_algorithm,
    )


async def current_content(session: AsyncSession, file: FileRow) -> Content:
    """The file's content now, with the number of the version that committed it."""
    assert file.blob_key is not None
    upload_id = file.blob_key.rsplit("/", 1)[-1]
    upload = await session.get(UploadRow, upload_id)
    return Content(
        key=file.blob_key,
        version=upload.file_version if upload is not None and upload.file_id == file.id else 0,
        size=file.size,
        checksum=file.checksum,
        checksum_algorithm=file.checksum_algorithm,
    )


async def version_content(session: AsyncSession, file: FileRow, version: int) -> Content:
    """What a Download of `version` (0: the current content) reads."""
    if version < 0:
        raise InvalidArgument("version", "must not be negative (0: the current content)")
    if version == 0:
        return await current_content(session, file)
    return content_of(await find_version(session, file, version))


async def list_versions(
    sessions: async_sessionmaker[AsyncSession],
    tokens: PageTokens,
    identity: Identity,
    request: upload_pb2.ListVersionsRequest,
) -> upload_pb2.ListVersionsResponse:
    """One page of the file's content versions, newest first (module docstring)."""
    file_id = validation.resource_id(request.file_id, "file_id")
    limit = page_size(request.page_size)
    purpose = f"{_PURPOSE}:{file_id}"
    position = tokens.decode(request.page_token, purpose, 1)
    async with sessions() as session:
        await read_only(session)
        # Permission first: another tenant learns nothing about the file.
        file, role = await readable(session, identity, file_id)
        await raise_if_hidden(session, identity.tenant_id, file_id)
        if file.kind != FILE:
            raise WrongKind("a folder has no versions", file_id=file.id)
        query = _content_versions(file.id)
        if position is not None:
            query = query.where(UploadRow.file_version < int(position[0]))
        rows = list(
            (
                await session.execute(
                    query.order_by(UploadRow.file_version.desc()).limit(limit + 1)
                )
            ).scalars()
        )
    more = len(rows) > limit
    rows = rows[:limit]
    return upload_pb2.ListVersionsResponse(
        versions=[version_message(file, r) for r in rows],
        next_page_token=tokens.encode(purpose, [rows[-1].file_version]) if more else "",
        file=file_message(file, role),
    )
