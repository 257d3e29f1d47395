"""UploadFile: a small file in one request, committed as the file's next version before
the answer.

Built from the pieces a chunked upload uses, so it keeps the same invariants by the same
code, only without the waits between them:

1. The data is hashed first; a given `checksum` that does not match is CHECKSUM_MISMATCH
   before anything is stored (no upload, no chunk). More than `max_chunk_size` bytes is
   INVALID_ARGUMENT (`data`): larger files take CreateUpload and chunks.
2. `Uploads.create` makes a one-chunk upload: the caller's write access to the target,
   the name, the size limit, the open-uploads cap and the tenant quota are checked as for
   CreateUpload, and a `client_request_id` seen before returns that upload (same target
   and bytes, else CLIENT_REQUEST_ID_REUSED). The upload's `expected_checksum` is the
   data's, so the merge verifies the whole file too.
3. `ChunkStore.put` stores the only chunk (rights re-checked, temp + fsync + rename, the
   row on `UNIQUE(upload_id, chunk_index)`: invariants 1-2) and, in the same group-commit
   transaction, wins `uploading -> merging` (invariant 3) and enqueues the merge job
   leased to this process (`inline.InlineMerges.claim`).
4. `InlineMerges.run` runs that job here: merge_core (4), the file lock `file:{file_id}`
   through the merge's `FileLocks`, `check_uploader` and the fencing check in the commit
   (7), the version bump with its outbox event (6), `merging -> completed` (5), the job's
   idempotency key recorded with them (9). A crash anywhere leaves a job the runtime
   finishes (see `inline`).

Exactly once: the conditional `uploading -> merging` has one winner, and only the winner
holds a merge job to run, so a retry (or a concurrent duplicate) of the same
`client_request_id` can only find the upload and answer with its outcome; it never makes a
second version. Concurrent duplicates in one process wait for the first one's run and
then read its outcome; one whose merge is running elsewhere (another replica, the runtime
after a crash or a retry) is MERGE_PENDING (UNAVAILABLE: retry the same request, or wait
with GetUpload).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from serentak.upload.v1 import upload_pb2
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.auth import Identity
from services.common.db import read_only
from services.common.errors import AlreadyExists, InvalidArgument
from services.common.logging import get_logger
from services.upload import checksums, metrics
from services.upload.errors import (
    ChecksumMismatch,
    FileDeleted,
    MergePending,
    UploaderNotAllowed,
    UploadFailed,
    UploadNotActive,
)
from services.upload.files.permissions import readable
from services.upload.ingest.chunks import ChunkStore
from services.upload.ingest.uploads import Uploads
from services.upload.merge.inline import InlineMerges
from services.upload.models import COMPLETED, FAILED, MERGING, UPLOADING, FileRow, UploadRow

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


class UploadFiles:
    """The UploadFile use case (module docstring)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        uploads: Uploads,
        chunks: ChunkStore,
        inline: InlineMerges,
        *,
        max_chunk_size: int,
    ) -> None:
        self._sessions = sessions
        self._uploads = uploads
        self._chunks = chunks
        self._inline = inline
        self._max = max_chunk_size
        # In-flight requests per (tenant, user, client_request_id): a concurrent duplicate
        # waits for the first one instead of racing it to the same outcome.
        self._flights: dict[str, asyncio.Future[None]] = {}

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
        upload = await self._uploads.create(identity, shape)
        if upload.expected_checksum != checksum:
            # The same request id, target and size, other bytes: another request.
            raise AlreadyExists(
                "client_request_id was used for a different upload",
                reason="CLIENT_REQUEST_ID_REUSED",
                upload_id=upload.id,
            )
        if upload.status == UPLOADING:
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
