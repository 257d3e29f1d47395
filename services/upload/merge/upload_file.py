"""UploadFile: a small file in one request, committed as the file's next version before
the answer, in one database transaction.

A file that fits one request needs no chunks, no merge job and no merge copy; it keeps the
invariants by the same code the chunked path commits with:

1. The data is hashed first; a given `checksum` that does not match is CHECKSUM_MISMATCH
   before anything is stored. More than `max_chunk_size` bytes is INVALID_ARGUMENT
   (`data`, DATA_TOO_LARGE): larger files take CreateUpload and chunks.
2. `Uploads.draft` runs CreateUpload's checks that need no read (the name, the size
   limit, the ids); the target's are made in the committing transaction (4).
3. The bytes go to the new version's content key (`files/{file_id}/{upload_id}`): temp +
   fsync + rename (`BlobStore.put`), durable before anything refers to them (invariant 4's
   "no partial object"). With the local store the write runs while the commit (4) takes
   its lock, checks and writes its rows; the commit's unit waits for it before the COMMIT,
   and a failed write fails the unit. With S3 the PUT comes first: no transaction waits on
   a network write. A crash before the commit leaves an object no row names, which the
   reclaim sweep deletes after its grace period; a refused commit deletes it at once.
4. A new version commits under the file lock `file:{file_id}` (the merge's key, through
   the same `FileLocks`, held `briefly`: no Hold stream, the release not waited for; the
   body is one short transaction and its write is fenced). A new file takes no lock: its
   id is made for this request and named nowhere before the commit, so there is no other
   writer to exclude or fence. One transaction (shared with the other small files
   committing at the moment: `services.common.group_commit`, which may run the unit again
   after another's failure, so it keeps nothing of a run that rolled back)
   checks the target (`drafts.check_target`: the caller's write access, a live folder
   with the name free, or a live file; CreateUpload's errors), the open-upload cap and
   the tenant quota, and commits with `commit_content`, the chunked path's commit: the
   fencing check `commit_fenced` (invariant 7), the version bump with its outbox event
   (6), and the upload row stored `completed` with its version (5: one INSERT where the
   chunked path moves `merging -> completed`). No job is
   involved, so there is no idempotency key to record (9): the unique client_request_id
   is what makes a retry find this upload.

Exactly once: the upload row and the version it made commit together or not at all, and
the `client_request_id` is unique per user, so a retry (or a concurrent duplicate on
another replica, which loses the insert) finds the committed upload and answers with its
outcome; it never makes a second version. A retry refused by the checks (its own file now
holds the name; the rights or quota changed) looks for that upload before answering.
Concurrent duplicates in one process wait for the first one and then read its outcome. An
upload of the same `client_request_id` made by CreateUpload and still open takes the
chunked path's pieces (`ChunkStore.put` and the inline merge job).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import serentak.errors
from serentak.errors import SerentakError
from serentak.upload.v1 import upload_pb2
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.auth import Identity
from services.common.db import read_only
from services.common.errors import AlreadyExists, InvalidArgument
from services.common.group_commit import GroupCommits
from services.common.group_reads import Declared
from services.common.logging import get_logger
from services.common.tasks import ShieldedWork
from services.upload import checksums, metrics
from services.upload.errors import (
    ChecksumMismatch,
    FileDeleted,
    MergePending,
    StaleFencingToken,
    UploaderNotAllowed,
    UploadFailed,
    UploadNotActive,
)
from services.upload.files.permissions import readable
from services.upload.files.tree import NAME_HOLDERS, lock_tree
from services.upload.ingest.allowance import ALLOWANCE_FIGURES
from services.upload.ingest.chunks import ChunkStore
from services.upload.ingest.drafts import check_target
from services.upload.ingest.finish_waits import FinishSignals
from services.upload.ingest.uploads import Uploads
from services.upload.merge.file_locks import FileLocks
from services.upload.merge.inline import InlineMerges
from services.upload.merge.version_commit import commit_content
from services.upload.models import (
    COMPLETED,
    FAILED,
    MERGING,
    UPLOADING,
    FileRow,
    UploadRow,
    utcnow,
)
from services.upload.storage.blob_store import BlobStore, Merged, content_key

log = get_logger(__name__)

# A merge refused at commit fails the upload with "<REASON>: message" (merge_job).
_REFUSALS: dict[str, type[UploaderNotAllowed] | type[FileDeleted]] = {
    UploaderNotAllowed.reason: UploaderNotAllowed,
    FileDeleted.reason: FileDeleted,
}


@dataclass(frozen=True, slots=True)
class UploadedFile:
    """The completed upload and its file as committed, with the caller's role on it."""

    upload: UploadRow
    file: FileRow
    role: str


@dataclass(frozen=True, slots=True)
class FileLockPolicy:
    """How the one-transaction commit takes the file lock (the merge's settings)."""

    ttl_seconds: int = 30
    wait_seconds: float = 30.0


class UploadFiles:
    """The UploadFile use case (module docstring)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        uploads: Uploads,
        chunks: ChunkStore,
        inline: InlineMerges,
        *,
        blobs: BlobStore,
        locks: FileLocks,
        signals: FinishSignals,
        max_chunk_size: int,
        groups: GroupCommits,
        lock_policy: FileLockPolicy | None = None,
        write_during_commit: bool = False,
    ) -> None:
        self._sessions = sessions
        self._uploads = uploads
        self._chunks = chunks
        self._inline = inline
        self._blobs = blobs
        self._locks = locks
        self._signals = signals
        self._max = max_chunk_size
        self._lock = lock_policy or FileLockPolicy()
        # The process's group committer (owned by the caller, who closes it).
        self._groups = groups
        # Write the bytes while the commit's transaction runs: for a local store, whose
        # write is an fsync. A store across the network writes first, so no transaction
        # (nor the tenant's tree lock it holds) waits on a PUT.
        self._write_during_commit = write_during_commit
        # In-flight requests per (tenant, user, client_request_id): a concurrent duplicate
        # waits for the first one instead of racing it to the same outcome.
        self._flights: dict[str, asyncio.Future[None]] = {}
        self._running = ShieldedWork()

    async def upload(
        self, identity: Identity, request: upload_pb2.UploadFileRequest
    ) -> UploadedFile:
        """Create, store and commit `request.data` as a new file or a new version."""
        data = request.data
        if len(data) > self._max:
            raise InvalidArgument(
                "data",
                f"at most {self._max} bytes in one request; larger files: CreateUpload and chunks",
                reason="DATA_TOO_LARGE",
            )
        algorithm = checksums.algorithm_name(request.checksum_algorithm)
        actual = await checksums.digest_async(data, algorithm)
        if request.checksum:
            claimed = checksums.normalize_hex(request.checksum, algorithm, "checksum")
            if claimed != actual:
                raise ChecksumMismatch(
                    "checksum",
                    f"data hashes to {actual}, not {claimed}",
                    expected=claimed,
                    actual=actual,
                )
        crid = request.client_request_id
        if not crid:
            return await self._run(identity, request, actual)
        key = f"{identity.tenant_id}\0{identity.user_id}\0{crid}"
        while (earlier := self._flights.get(key)) is not None:
            # Its outcome (or error) is not ours to return as is: once it is over, this
            # request finds the upload it made and answers for itself.
            with contextlib.suppress(BaseException):
                await asyncio.shield(earlier)
        flight = asyncio.get_running_loop().create_future()
        self._flights[key] = flight
        try:
            return await self._run(identity, request, actual)
        finally:
            del self._flights[key]
            flight.set_result(None)

    async def _run(
        self, identity: Identity, request: upload_pb2.UploadFileRequest, checksum: str
    ) -> UploadedFile:
        data = request.data
        shape = upload_pb2.CreateUploadRequest(
            client_request_id=request.client_request_id,
            total_chunks=1,
            total_size=len(data),
            chunk_size=max(len(data), 1),
            checksum_algorithm=request.checksum_algorithm,
            expected_checksum=checksum,
        )
        which = request.WhichOneof("target")
        if which == "new_file":
            shape.new_file.CopyFrom(request.new_file)
        elif which == "file_id":
            shape.file_id = request.file_id
        upload = await self._uploads.draft(identity, shape)
        # Shielded from the calling RPC: a caller that goes away never leaves a commit
        # half-way, nor its bytes deleted under a version that did commit.
        try:
            return await self._running.run(self._store(identity, upload, data, checksum))
        except IntegrityError:
            # The same client_request_id was stored first (another request): its outcome.
            earlier = await self._uploads.earlier(identity, shape, upload)
            return await self._earlier(identity, earlier, data, checksum)
        except SerentakError:
            # A retry whose first try was stored gets that outcome even where the checks
            # would refuse it now (its name taken by itself, rights, quota).
            found = await self._uploads.earlier_if_any(identity, shape, upload)
            if found is None:
                raise
            return await self._earlier(identity, found, data, checksum)

    async def _store(
        self, identity: Identity, upload: UploadRow, data: bytes, checksum: str
    ) -> UploadedFile:
        """Write the bytes to the version's key and commit (module docstring, 3-4); with
        `write_during_commit` the commit's checks and rows are made while the bytes are
        written, and it waits for them to be durable before its COMMIT."""
        key = content_key(upload.file_id, upload.id)
        written = asyncio.ensure_future(self._blobs.put(key, data))
        if not self._write_during_commit:
            await written  # a failed write raises here, nothing stored
        try:
            done = await self._commit(identity, upload, key, checksum, written)
        except (SerentakError, IntegrityError) as refused:
            # Refused before the commit (rights, quota, the lock, fencing, the request id
            # stored by another): nothing refers to the bytes. Any other failure may have
            # come with the COMMIT itself; the reclaim sweep deletes the bytes if no row
            # names them.
            if isinstance(refused, StaleFencingToken | serentak.errors.LockHeld):
                metrics.MERGE_FAILURES.labels("lock").inc()
            with contextlib.suppress(Exception):
                await written  # not deleted while still being written
            with contextlib.suppress(Exception):
                await self._blobs.delete(key)
            raise
        finally:
            if not written.done():  # a failure before the unit waited for it
                with contextlib.suppress(Exception):
                    await written
        # Committed: GetUpload waiters on this upload (a duplicate's) may look now.
        self._signals.finished(upload.id)
        metrics.INLINE_MERGES.labels("upload_file").inc()
        metrics.MERGES.labels("completed").inc()
        log.info(
            "upload_file_committed",
            upload_id=upload.id,
            file_id=done.file.id,
            version=done.file.version,
            size=len(data),
            fencing_token=done.file.last_lock_token,
        )
        return done

    async def close(self) -> None:
        """Let the commits under way finish (shutdown); each is one short transaction."""
        await self._running.wait(self._lock.wait_seconds + 5)

    async def _commit(
        self,
        identity: Identity,
        upload: UploadRow,
        key: str,
        checksum: str,
        written: Awaitable[None],
    ) -> UploadedFile:
        """Store the upload and commit its version in one transaction, under the file lock."""
        stored = Merged(
            key=key,
            size=upload.total_size,
            checksum=checksum,
            algorithm=upload.checksum_algorithm,
            chunk_count=1,
        )
        # In lock order (the tenant's tree and allowance locks, then the folder's row).
        order = (upload.tenant_id, upload.folder_id, upload.file_id)
        if upload.is_new_file:
            # A new file's id was made for this request and is named nowhere until this
            # commit: no other writer to exclude or fence, so no lock. Its token is 0, as a
            # root's or a synced file's; any lock taken on it later has a greater one.
            # Its unit writes only behind, so the group reads its checks' rows with the
            # next new files' (`group_reads`: the name's holder, the allowance figures). A
            # new version's unit declares none: its fenced UPDATE is written straight.
            reads: Declared = {
                NAME_HOLDERS: (upload.tenant_id, upload.folder_id, upload.name, ""),
                ALLOWANCE_FIGURES: (identity.tenant_id, identity.user_id),
            }
            return await self._groups.run(
                self._committer(identity, upload, stored, 0, written), order, reads=reads
            )
        async with self._locks.briefly(
            f"file:{upload.file_id}",
            tenant_id=upload.tenant_id,
            ttl=self._lock.ttl_seconds,
            wait_timeout=self._lock.wait_seconds,
        ) as token:
            # Shared with the other small files committing now (group commit).
            return await self._groups.run(
                self._committer(identity, upload, stored, token, written), order
            )

    def _committer(
        self,
        identity: Identity,
        upload: UploadRow,
        stored: Merged,
        token: int,
        written: Awaitable[None],
    ) -> Callable[[AsyncSession], Awaitable[UploadedFile]]:
        """The unit of work that stores `upload` and commits its version (module docstring)."""

        async def commit(session: AsyncSession) -> UploadedFile:
            # The tree lock before any row (tree.lock_tree; the commit logs).
            await lock_tree(session, upload.tenant_id)
            # CreateUpload's checks of the target, here in the committing transaction (and
            # for a new version under the file lock, as the merge checks its uploader).
            target, role = await check_target(session, identity, upload)
            # The open-upload cap and quota where the upload row was stored before: its
            # INSERT comes with the version, the row completed at once (`store_upload`).
            await self._uploads.allow(session, identity, upload)
            upload.received_chunk_count = 1
            upload.merge_started_at = utcnow()

            async def store_upload(session: AsyncSession) -> None:
                await self._uploads.insert(session, identity, upload, allowed=True, kept=False)

            file = await commit_content(
                session,
                upload,
                stored,
                token,
                chunks=False,
                checked_folder=target if upload.is_new_file else None,
                store_upload=store_upload,
            )
            # `upload` holds the stored row's values, so the answer needs no re-read. Its
            # waiters are woken once the group has committed (`_store`).
            # Nothing commits before the bytes it names are durable (invariant 4); a write
            # that failed fails this unit, its rows rolled back.
            await written
            return UploadedFile(upload, file, role)

        return commit

    async def _earlier(
        self, identity: Identity, upload: UploadRow, data: bytes, checksum: str
    ) -> UploadedFile:
        """The outcome of an earlier request with the same client_request_id."""
        if upload.expected_checksum != checksum:
            # The same request id, target and size, other bytes: another request.
            raise AlreadyExists(
                "client_request_id was used for a different upload",
                reason="CLIENT_REQUEST_ID_REUSED",
                upload_id=upload.id,
            )
        if upload.status == UPLOADING:
            # Opened by CreateUpload with this request id: its one chunk completes it.
            outcome = await self._chunks.put(
                identity, upload.id, 0, data, checksum, claim=self._inline.claim
            )
            if outcome.claimed is not None:
                await self._inline.run(outcome.claimed)
                metrics.INLINE_MERGES.labels("upload_file").inc()
        return await self.finished(identity, upload.id)

    async def finished(self, identity: Identity, upload_id: str) -> UploadedFile:
        """The completed upload and its file; a typed error for any other end."""
        async with self._sessions() as session:
            await read_only(session)
            upload = await self._uploads.load(session, identity, upload_id)
            if upload.status == COMPLETED:
                file, role = await readable(session, identity, upload.file_id)
                return UploadedFile(upload, file, role)
        if upload.status == MERGING:
            raise MergePending(
                "the upload's merge is running elsewhere and completes without this call;"
                " retry the same request or wait with GetUpload",
                upload_id=upload.id,
            )
        if upload.status == FAILED:
            reason, _, _ = upload.failure_reason.partition(":")
            refusal = _REFUSALS.get(reason)
            if refusal is not None:
                raise refusal(upload.failure_reason, upload_id=upload.id)
            raise UploadFailed(upload.failure_reason or "the upload failed", upload_id=upload.id)
        raise UploadNotActive(
            f"the upload is {upload.status}", upload_id=upload.id, status=upload.status
        )
