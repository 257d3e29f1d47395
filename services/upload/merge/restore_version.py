"""RestoreVersion: a kept older version becomes the file's next version, committed and
announced like any upload.

1. Checks, in a read-only snapshot: the caller may write the file (editor or owner; a
   viewer is PERMISSION_DENIED / INSUFFICIENT_ROLE, another tenant's id FILE_NOT_FOUND), it
   is a live file, and `version` is a kept content version other than the current one
   (VERSION_NOT_FOUND, VERSION_PURGED, VERSION_IS_CURRENT: `files/history.py`). A
   `client_request_id` this caller already used answers with the version that call made.
2. The old bytes are copied to the new version's own key, `files/{file_id}/{upload_id}` of
   a new upload (`BlobStore.copy`: temp + fsync + rename locally, CopyObject on S3), before
   anything refers to them. A copy, not a new row naming the old blob, because the reclaim
   sweep decides about a key by the rank and age of the one upload it is named after
   (`storage/lifecycle/sweep.py` step 3 deletes `content_key(file_id, upload_id)` once that
   upload is past retention, sparing only the file's *current* blob_key): a restored
   version sharing v3's blob would lose its bytes when v3 ages out while the restored one
   is still a kept version, with nothing in the row to say so. With a copy every version
   owns its bytes, retention counts the restored version like any other, and the sweep
   needs no change; the price is the bytes stored twice until the old version ages out.
   If the sweep deletes the old bytes before the copy opens them, the answer is
   VERSION_PURGED; once the copy exists, the old version's fate no longer matters.
3. Under the file lock `file:{file_id}` (the merge's key through the same `FileLocks`,
   held `briefly` as UploadFile holds it: no Hold stream, the release not waited for; the
   body is one short transaction whose write is fenced), one transaction
   re-checks the caller's rights and the file (not deleted, `expected_version`, the source
   still not the current content), stores the new version's upload row within the
   caller's open-upload cap and the tenant's quota, and commits with `commit_content`, the
   merge's commit: the fencing check `commit_fenced` (invariant 7), the version bump with
   its `file.content.updated` outbox event (6) and `merging -> completed` (5). A restore
   racing an upload or another restore of the file waits its turn on the lock; each
   commits its own version, once, and is announced once.

A refusal after the copy deletes the copy (nothing refers to it). A failure that may have
come with the COMMIT itself leaves it: the reclaim sweep deletes the bytes if no row names
them. The commit is shielded from the calling RPC, so a caller that goes away never leaves
it half-way nor the bytes deleted under a version that did commit.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from serentak.errors import SerentakError
from serentak.upload.v1 import upload_pb2
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common import validation
from services.common.auth import Identity
from services.common.db import read_only
from services.common.errors import Aborted, AlreadyExists, InvalidArgument
from services.common.logging import get_logger
from services.common.tasks import ShieldedWork
from services.upload.errors import (
    FileDeleted,
    VersionIsCurrent,
    VersionMismatch,
    VersionPurged,
    WrongKind,
)
from services.upload.files.history import content_of, find_version, is_current
from services.upload.files.permissions import readable, writable
from services.upload.files.tree import lock_tree, new_id
from services.upload.files.visibility import raise_if_hidden
from services.upload.ingest.uploads import Uploads
from services.upload.merge.file_locks import FileLocks
from services.upload.merge.upload_file import FileLockPolicy
from services.upload.merge.version_commit import commit_content
from services.upload.models import COMPLETED, FILE, MERGING, FileRow, UploadRow, utcnow
from services.upload.storage.blob_store import BlobStore, Merged, content_key

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Restored:
    """The file as committed, the new version's upload row, the caller's role, and the
    version whose content it copies."""

    file: FileRow
    upload: UploadRow
    role: str
    restored_from: int


class VersionRestores:
    """The RestoreVersion use case (module docstring)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        blobs: BlobStore,
        locks: FileLocks,
        uploads: Uploads,
        lock_policy: FileLockPolicy | None = None,
    ) -> None:
        self._sessions = sessions
        self._blobs = blobs
        self._locks = locks
        # Stores the new version's upload row (allowance checked) and finds earlier tries.
        self._uploads = uploads
        self._lock = lock_policy or FileLockPolicy()
        self._running = ShieldedWork()

    async def restore(
        self, identity: Identity, request: upload_pb2.RestoreVersionRequest
    ) -> Restored:
        """Commit version `request.version`'s content as the file's next version."""
        file_id = validation.resource_id(request.file_id, "file_id")
        crid = validation.client_request_id(request.client_request_id)
        if request.version < 1:
            raise InvalidArgument("version", "must be a content version number (ListVersions)")
        if request.expected_version < 0:
            raise InvalidArgument("expected_version", "must not be negative (0: no check)")
        request_key = f"{identity.tenant_id}:{identity.user_id}:{crid}" if crid else None
        earlier = await self._uploads.by_request_key(request_key) if request_key else None
        if earlier is not None:
            return await self._same_request(identity, earlier, file_id, request.version)
        file, source = await self._check(identity, file_id, request.version)
        upload = _new_version_row(identity, file, source, request_key, crid)
        # Shielded: a caller that goes away never leaves the commit half-way, nor the
        # copy deleted under a version that did commit.
        try:
            return await self._running.run(self._copy_and_commit(identity, source, upload, request))
        except IntegrityError:
            # The same client_request_id committed first (a concurrent retry): its outcome.
            assert request_key is not None
            earlier = await self._uploads.by_request_key(request_key)
            if earlier is None:
                raise Aborted(
                    "the restore could not be stored; retry", reason="RESTORE_CONFLICT"
                ) from None
            return await self._same_request(identity, earlier, file_id, request.version)

    async def _check(
        self, identity: Identity, file_id: str, version: int
    ) -> tuple[FileRow, UploadRow]:
        """Step 1: a live file the caller may write, and its kept source version."""
        async with self._sessions() as session:
            await read_only(session)
            # Permission first: another tenant, or no role, learns nothing about versions.
            file, _ = await writable(session, identity, file_id)
            await raise_if_hidden(session, identity.tenant_id, file_id)
            _require_live_file(file)
            source = await find_version(session, file, version)
            _require_not_current(file, source)
            return file, source

    async def _copy_and_commit(
        self,
        identity: Identity,
        source: UploadRow,
        upload: UploadRow,
        request: upload_pb2.RestoreVersionRequest,
    ) -> Restored:
        """Steps 2 and 3; the copy is deleted again if the commit is refused."""
        key = content_key(upload.file_id, upload.id)
        try:
            await self._blobs.copy(content_key(source.file_id, source.id), key)
        except FileNotFoundError:
            raise VersionPurged(
                f"version {source.file_version}'s content was deleted by the retention policy",
                file_id=source.file_id,
                version=source.file_version,
            ) from None
        try:
            done = await self._commit(identity, source, upload, request.expected_version)
        except (SerentakError, IntegrityError):
            with contextlib.suppress(Exception):
                await self._blobs.delete(key)
            raise
        log.info(
            "version_restored",
            file_id=done.file.id,
            upload_id=upload.id,
            version=done.file.version,
            restored_from=source.file_version,
            size=upload.total_size,
            fencing_token=done.file.last_lock_token,
        )
        return done

    async def _commit(
        self, identity: Identity, source: UploadRow, upload: UploadRow, expected_version: int
    ) -> Restored:
        """Step 3: re-check, store the row and commit, in one transaction under the lock."""
        async with self._locks.briefly(
            f"file:{upload.file_id}",
            tenant_id=upload.tenant_id,
            ttl=self._lock.ttl_seconds,
            wait_timeout=self._lock.wait_seconds,
        ) as token:
            async with self._sessions.begin() as session:
                done = await commit_restore(
                    session, self._uploads, identity, source, upload, token, expected_version
                )
        return done

    async def _same_request(
        self, identity: Identity, earlier: UploadRow, file_id: str, version: int
    ) -> Restored:
        """The outcome of an earlier call with this client_request_id, if it restored this
        version (same file, same bytes; the source may be purged since);
        CLIENT_REQUEST_ID_REUSED otherwise."""
        async with self._sessions() as session:
            await read_only(session)
            file, role = await readable(session, identity, file_id)
            source = await find_version(session, file, version, kept=False)
        if (
            earlier.file_id != file_id
            or earlier.status != COMPLETED
            or (earlier.final_checksum, earlier.total_size)
            != (source.final_checksum, source.total_size)
        ):
            raise AlreadyExists(
                "client_request_id was used for another request",
                reason="CLIENT_REQUEST_ID_REUSED",
                upload_id=earlier.id,
            )
        return Restored(file, earlier, role, version)

    async def close(self) -> None:
        """Let the commits under way finish (shutdown); each is one short transaction."""
        await self._running.wait(self._lock.wait_seconds + 5)


async def commit_restore(
    session: AsyncSession,
    uploads: Uploads,
    identity: Identity,
    source: UploadRow,
    upload: UploadRow,
    token: int,
    expected_version: int = 0,
) -> Restored:
    """Commit `upload` (a copy of `source`'s bytes, already at its key) as the file's next
    version under lock `token`, in the caller's transaction (module docstring, step 3).

    ABORTED / STALE_FENCING_TOKEN when a newer lock holder committed first (`commit_fenced`).
    """
    # The tree lock before the upload row is written (tree.lock_tree; commit_content logs).
    await lock_tree(session, upload.tenant_id)
    file, role = await writable(session, identity, upload.file_id)
    _require_live_file(file)
    if expected_version and file.version != expected_version:
        raise VersionMismatch(
            f"the file is at version {file.version}, not {expected_version}",
            file_id=file.id,
            expected_version=expected_version,
            current_version=file.version,
        )
    _require_not_current(file, source)
    await uploads.insert(session, identity, upload)
    copied = Merged(
        key=content_key(upload.file_id, upload.id),
        size=source.total_size,
        checksum=source.final_checksum,
        algorithm=source.checksum_algorithm,
        chunk_count=1,
    )
    file = await commit_content(session, upload, copied, token, chunks=False)
    # The answer shows the row as committed (the status move set it in SQL).
    await session.refresh(upload)
    return Restored(file, upload, role, source.file_version)


def _new_version_row(
    identity: Identity, file: FileRow, source: UploadRow, request_key: str | None, crid: str
) -> UploadRow:
    """The new version's upload row, not yet stored: `merging` until `commit_content`
    moves it to `completed` with its version; where the file is now (it may have been
    renamed or moved since `source`). No chunks, and it says so (0 of 0), so the audit's
    chunk counts (invariants 2 and 3) hold for it."""
    now = utcnow()
    content = content_of(source)
    return UploadRow(
        id=new_id(),
        tenant_id=identity.tenant_id,
        owner_user_id=identity.user_id,
        request_key=request_key,
        client_request_id=crid,
        file_id=source.file_id,
        is_new_file=False,
        folder_id=file.parent_id or "",
        name=file.name,
        status=MERGING,
        total_chunks=0,
        total_size=content.size,
        chunk_size=max(content.size, 1),
        checksum_algorithm=content.checksum_algorithm,
        expected_checksum=content.checksum,
        received_chunk_count=0,
        created_at=now,
        updated_at=now,
        expires_at=now,
        merge_started_at=now,
        file_version=0,
        final_checksum="",
        failure_reason="",
    )


def _require_live_file(file: FileRow) -> None:
    if file.kind != FILE:
        raise WrongKind("a folder has no versions", file_id=file.id)
    if file.deleted_at is not None:
        raise FileDeleted("the file is deleted; restore it from the trash first", file_id=file.id)


def _require_not_current(file: FileRow, source: UploadRow) -> None:
    if is_current(file, source):
        raise VersionIsCurrent(
            f"version {source.file_version} is the file's current content",
            file_id=file.id,
            version=source.file_version,
        )
