"""gRPC surface of `serentak.upload.v1` UploadService, FileService, UploadAdminService.

Each handler identifies the caller, calls one domain use case and converts the result.
Rate limits are applied around them, at the RPC boundary (rate_families.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import deque
from collections.abc import AsyncIterator, Callable

import grpc
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc

from services.common.auth import Authenticator, Identity
from services.common.errors import InvalidArgument
from services.upload import convert
from services.upload.audit import UploadAudit
from services.upload.files.change_feed import ChangeFeed
from services.upload.files.history import version_message
from services.upload.files.use_cases import Files
from services.upload.ingest.chunk_commits import Chain
from services.upload.ingest.chunks import ChunkOutcome, ChunkStore, PreparedChunk
from services.upload.ingest.finish_waits import UploadWaits
from services.upload.ingest.uploads import Uploads
from services.upload.merge.inline import InlineMerges
from services.upload.merge.restore_version import VersionRestores
from services.upload.merge.upload_file import UploadFiles
from services.upload.metrics import BYTES_RECEIVED, BYTES_SENT, INLINE_MERGES

# At most this many of one stream's chunks wait for or sit in a group commit at once (staged:
# on the local store their bytes are on disk by then, not in memory).
STREAM_COMMIT_DEPTH = 4


class UploadServicer(upload_pb2_grpc.UploadServiceServicer):
    """Resumable chunked uploads."""

    def __init__(
        self,
        auth: Authenticator,
        uploads: Uploads,
        chunks: ChunkStore,
        on_merge_started: Callable[[], None] = lambda: None,
        upload_files: UploadFiles | None = None,
        inline: InlineMerges | None = None,
        inline_max_bytes: int = 0,
        *,
        waits: UploadWaits | None = None,
    ) -> None:
        self._auth = auth
        self._uploads = uploads
        self._chunks = chunks
        self._upload_files = upload_files
        # The chunk that completes an upload of at most inline_max_bytes merges it before
        # its answer (merge/inline.py); bigger ones, or 0, leave it to the job runtime.
        self._inline = inline
        self._claim = (
            inline.small_claimer(inline_max_bytes)
            if inline is not None and inline_max_bytes > 0
            else None
        )
        # Wakes the in-process workers so a merge starts without waiting for a poll.
        self._on_merge_started = on_merge_started
        # GetUpload's wait_finished_ms (without: answered at once).
        self._waits = waits

    async def CreateUpload(
        self, request: upload_pb2.CreateUploadRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.Upload:
        identity = self._auth.require_user(context)
        row = await self._uploads.create(identity, request)
        upload, missing = await self._uploads.get(identity, row.id)
        return convert.upload_message(upload, missing)

    async def _put(
        self, request: upload_pb2.PutChunkRequest, context: grpc.aio.ServicerContext
    ) -> ChunkOutcome:
        identity = self._auth.require_user(context)
        data = request.data  # one copy out of the message (each access makes a new one)
        BYTES_RECEIVED.inc(len(data))
        outcome = await self._chunks.put(
            identity,
            request.upload_id,
            request.chunk_index,
            data,
            request.checksum,
            claim=self._claim,
        )
        return await self._stored(identity, outcome)

    async def _stored(self, identity: Identity, outcome: ChunkOutcome) -> ChunkOutcome:
        if outcome.claimed is not None and self._inline is not None:
            await self._inline.run(outcome.claimed)
            INLINE_MERGES.labels("last_chunk").inc()
            upload, _ = await self._uploads.get(identity, outcome.upload.id)
            return dataclasses.replace(outcome, upload=upload)
        if outcome.started_merge:
            self._on_merge_started()
        return outcome

    async def PutChunk(
        self, request: upload_pb2.PutChunkRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.PutChunkResponse:
        outcome = await self._put(request, context)
        return convert.chunk_response(outcome.upload, None, outcome.index, outcome.duplicate)

    async def UploadChunks(
        self,
        request_iterator: AsyncIterator[upload_pb2.PutChunkRequest],
        context: grpc.aio.ServicerContext,
    ) -> upload_pb2.UploadChunksResponse:
        """Store the stream's chunks in order, overlapping the steps of neighbouring chunks.

        While earlier chunks commit (up to `STREAM_COMMIT_DEPTH` of them, queued for the
        group commit with every other sender's), the next chunk is checked, hashed and
        staged and the one after it is received. A chunk is checked against the rows as
        they stand, and answers come in stream order, so the per-chunk answers (and which
        repeat of an index is the duplicate) are those of sequential PutChunk calls; the
        first failure in stream order ends the call with its error (the stream's later
        chunks still queued are withdrawn and their staged bytes removed).
        """
        identity = self._auth.require_user(context)
        response = upload_pb2.UploadChunksResponse()
        last_upload_id = ""
        messages = aiter(request_iterator)
        receiving: asyncio.Future[upload_pb2.PutChunkRequest] = asyncio.ensure_future(
            anext(messages)
        )
        committing: deque[tuple[asyncio.Task[ChunkOutcome], PreparedChunk]] = deque()
        chain = Chain()

        async def answer_oldest() -> None:
            # The oldest commit's answer; its failure comes before any later chunk's.
            nonlocal last_upload_id
            outcome = await self._stored(identity, await committing.popleft()[0])
            response.chunks.append(
                convert.chunk_response(outcome.upload, None, outcome.index, outcome.duplicate)
            )
            last_upload_id = outcome.upload.id

        try:
            while True:
                try:
                    request = await receiving
                except StopAsyncIteration:
                    break
                receiving = asyncio.ensure_future(anext(messages))
                data = request.data
                BYTES_RECEIVED.inc(len(data))
                while committing and (
                    committing[0][0].done() or len(committing) >= STREAM_COMMIT_DEPTH
                ):
                    await answer_oldest()
                try:
                    prepared = await self._chunks.prepare(
                        identity, request.upload_id, request.chunk_index, data, request.checksum
                    )
                except Exception:
                    while committing:  # an earlier chunk's failure is the first one
                        await answer_oldest()
                    raise
                task = asyncio.ensure_future(
                    self._chunks.commit(prepared, chain, claim=self._claim)
                )
                committing.append((task, prepared))
            while committing:
                await answer_oldest()
        finally:
            # A failed chunk or a cancelled call: stop receiving (and retrieve a receive
            # error that lost to the chunk's, so asyncio does not report it as unseen); the
            # stream's chunks still queued are withdrawn (their staged bytes removed).
            chain.failed = True
            if not receiving.cancel() and not receiving.cancelled():
                receiving.exception()
            for task, _ in committing:
                task.cancel()
            for task, prepared in committing:
                with contextlib.suppress(BaseException):
                    await task
                # A task cancelled before it ran never saw its staged bytes (removing
                # them is idempotent: nothing happens to published or removed ones).
                await asyncio.shield(self._chunks.abandon(prepared))
        if not last_upload_id:
            raise InvalidArgument("chunks", "the stream carried no chunk")
        upload, missing = await self._uploads.get(identity, last_upload_id)
        response.upload.CopyFrom(convert.upload_message(upload, missing))
        return response

    async def GetUpload(
        self, request: upload_pb2.GetUploadRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.Upload:
        identity = self._auth.require_user(context)
        if request.wait_finished_ms and self._waits is not None:
            upload, missing = await self._waits.get(
                identity, request.upload_id, request.wait_finished_ms, context.time_remaining()
            )
        else:
            upload, missing = await self._uploads.get(identity, request.upload_id)
        return convert.upload_message(upload, missing)

    async def AbortUpload(
        self, request: upload_pb2.AbortUploadRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.Upload:
        identity = self._auth.require_user(context)
        await self._uploads.abort(identity, request.upload_id)
        upload, missing = await self._uploads.get(identity, request.upload_id)
        return convert.upload_message(upload, missing)

    async def UploadFile(
        self, request: upload_pb2.UploadFileRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.UploadFileResponse:
        identity = self._auth.require_user(context)
        assert self._upload_files is not None, "UploadFile needs the UploadFiles use case"
        BYTES_RECEIVED.inc(len(request.data))
        done = await self._upload_files.upload(identity, request)
        return upload_pb2.UploadFileResponse(
            upload=convert.upload_message(done.upload, []),
            file=convert.committed_file_message(done.file, done.role, done.upload),
        )

    async def ListUploads(
        self, request: upload_pb2.ListUploadsRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.ListUploadsResponse:
        identity = self._auth.require_user(context)
        rows, token = await self._uploads.list(identity, request)
        return upload_pb2.ListUploadsResponse(
            uploads=[convert.upload_message(r) for r in rows], next_page_token=token
        )


class FileServicer(upload_pb2_grpc.FileServiceServicer):
    """The versioned file tree."""

    def __init__(
        self,
        auth: Authenticator,
        files: Files,
        restores: VersionRestores | None = None,
        changes: ChangeFeed | None = None,
    ) -> None:
        self._auth = auth
        self._files = files
        self._restores = restores
        self._changes = changes

    async def CreateFolder(
        self, request: upload_pb2.CreateFolderRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.File:
        row, role = await self._files.create_folder(self._auth.require_user(context), request)
        return convert.file_message(row, role)

    async def GetFile(
        self, request: upload_pb2.GetFileRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.File:
        row, role = await self._files.get(self._auth.require_user(context), request.file_id)
        return convert.file_message(row, role)

    async def ListFolder(
        self, request: upload_pb2.ListFolderRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.ListFolderResponse:
        return await self._files.list_folder(self._auth.require_user(context), request)

    async def RenameFile(
        self, request: upload_pb2.RenameFileRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.File:
        row, role = await self._files.rename(self._auth.require_user(context), request)
        return convert.file_message(row, role)

    async def MoveFile(
        self, request: upload_pb2.MoveFileRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.File:
        row, role = await self._files.move(self._auth.require_user(context), request)
        return convert.file_message(row, role)

    async def DeleteFile(
        self, request: upload_pb2.DeleteFileRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.File:
        row, role = await self._files.delete(self._auth.require_user(context), request)
        return convert.file_message(row, role)

    async def RestoreFile(
        self, request: upload_pb2.RestoreFileRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.File:
        row, role = await self._files.restore(self._auth.require_user(context), request)
        return convert.file_message(row, role)

    async def ShareFile(
        self, request: upload_pb2.ShareFileRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.File:
        identity = self._auth.require_user(context)
        self._refuse_a_token_for_a_user(identity, request.user_id)
        row, role = await self._files.share(identity, request)
        return convert.file_message(row, role)

    async def ShareFileBatch(
        self, request: upload_pb2.ShareFileBatchRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.ShareFileBatchResponse:
        """ShareFile for many users: one version, one event, each collaborator told once."""
        identity = self._auth.require_user(context)
        for grant in request.grants:
            self._refuse_a_token_for_a_user(identity, grant.user_id)
        outcome = await self._files.share_batch(identity, request)
        return upload_pb2.ShareFileBatchResponse(
            file=convert.file_message(outcome.file, "owner"),
            added=outcome.added,
            changed=outcome.changed,
            unchanged=outcome.unchanged,
        )

    def _refuse_a_token_for_a_user(self, identity: Identity, user_id: str) -> None:
        """A share with a bearer token (`dev-bob`) instead of its user (`bob`) would be
        granted to nobody: INVALID_ARGUMENT / USER_ID_IS_A_TOKEN, naming the user when
        they are of the caller's tenant."""
        meant = self._auth.identity_of_token(user_id) if user_id else None
        if meant is None:
            return
        same_tenant = not meant.is_service and meant.tenant_id == identity.tenant_id
        raise InvalidArgument(
            "user_id",
            "is a bearer token, not a user id"
            + (f"; that token's user is {meant.user_id!r}" if same_tenant else ""),
            reason="USER_ID_IS_A_TOKEN",
            **({"user_id": meant.user_id} if same_tenant else {}),
        )

    async def UnshareFile(
        self, request: upload_pb2.UnshareFileRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.File:
        row, role = await self._files.unshare(self._auth.require_user(context), request)
        return convert.file_message(row, role)

    async def ListCollaborators(
        self, request: upload_pb2.ListCollaboratorsRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.ListCollaboratorsResponse:
        rows = await self._files.collaborators(self._auth.require_user(context), request.file_id)
        return upload_pb2.ListCollaboratorsResponse(
            collaborators=[convert.collaborator_message(r) for r in rows]
        )

    async def ListSharedWithMe(
        self, request: upload_pb2.ListSharedWithMeRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.ListSharedWithMeResponse:
        return await self._files.shared_with_me(self._auth.require_user(context), request)

    async def Download(
        self, request: upload_pb2.DownloadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[upload_pb2.DownloadChunk]:
        identity = self._auth.require_user(context)
        content, blocks = await self._files.open_download(identity, request)
        offset = request.offset
        async for block in blocks:
            yield upload_pb2.DownloadChunk(offset=offset, data=block)
            BYTES_SENT.inc(len(block))
            offset += len(block)
        trailing = [
            ("x-checksum", content.checksum),
            ("x-checksum-algorithm", content.checksum_algorithm),
        ]
        if content.version:
            trailing.append(("x-version", str(content.version)))
        context.set_trailing_metadata(tuple(trailing))

    async def ListVersions(
        self, request: upload_pb2.ListVersionsRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.ListVersionsResponse:
        return await self._files.list_versions(self._auth.require_user(context), request)

    async def RestoreVersion(
        self, request: upload_pb2.RestoreVersionRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.RestoreVersionResponse:
        identity = self._auth.require_user(context)
        assert self._restores is not None, "RestoreVersion needs the VersionRestores use case"
        done = await self._restores.restore(identity, request)
        return upload_pb2.RestoreVersionResponse(
            file=convert.committed_file_message(done.file, done.role, done.upload),
            version=version_message(done.file, done.upload),
            restored_from=done.restored_from,
        )

    async def ListChanges(
        self, request: upload_pb2.ListChangesRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.ListChangesResponse:
        identity = self._auth.require_user(context)
        assert self._changes is not None, "ListChanges needs the ChangeFeed use case"
        return await self._changes.list_changes(identity, request, context.time_remaining())


class UploadAdminServicer(upload_pb2_grpc.UploadAdminServiceServicer):
    """Operator checks (the ops role only)."""

    def __init__(self, auth: Authenticator, audit: UploadAudit) -> None:
        self._auth = auth
        self._audit = audit

    async def AuditUploads(
        self, request: upload_pb2.AuditUploadsRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.AuditUploadsResponse:
        self._auth.require_ops(context)
        if request.sample_size < 0:
            raise InvalidArgument("sample_size", "must not be negative")
        if request.limit < 0:
            raise InvalidArgument("limit", "must not be negative")
        return await self._audit.run(request.sample_size, request.limit)
