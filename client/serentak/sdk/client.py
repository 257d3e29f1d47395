"""`SerentakClient`: the async SDK over the upload, file, lock and notify services.

Channels come from `serentak.channels` (TLS, call token, round_robin, keepalive);
the calls that are safe to repeat (reads, PutChunk, CreateUpload with its request id)
are retried by gRPC on UNAVAILABLE with backoff from the channel's service config.
Errors are the server's `grpc.aio.AioRpcError` (status + ErrorInfo reason), plus
`UploadFailed` and `ChecksumMismatch` for what the client itself finds; `hold` is the lock
client's (`serentak.sdk.locks`) and raises its typed errors (`LockHeld`, `LockLost`).
"""

# Client-side file I/O of one user's process: blocking reads and writes are fine here.
# ruff: noqa: ASYNC230, ASYNC240

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc

from serentak.channels import open_channel
from serentak.credentials import ClientSecurity, user_client_security
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from serentak.sdk.files import FileCalls
from serentak.sdk.locks import HeldLock, LockClient
from serentak.sdk.named import Named, UploadStatus
from serentak.sdk.results import ChecksumMismatch, DownloadResult, UploadFailed, rpc_reason
from serentak.sdk.transfer import (
    DEFAULT_CHUNK_SIZE,
    atomic_destination,
    chunk_count,
    chunk_length,
    upload_request_id,
)
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc

# What the upload calls return: an Upload whose `status` reads as a name.
Upload = Named[upload_pb2.Upload]
# (bytes done, bytes in all): called after every chunk sent or block received.
ProgressCallback = Callable[[int, int], None]

_MESSAGE_LIMIT = 64 * 1024 * 1024
_Stub = TypeVar("_Stub")
# Idempotent calls gRPC may repeat on UNAVAILABLE (PutChunk: a repeat is a duplicate;
# CreateUpload: the client_request_id returns the same upload).
_RETRY = (
    "serentak.upload.v1.UploadService",
    "serentak.upload.v1.FileService/GetFile",
    "serentak.upload.v1.FileService/ListFolder",
    "serentak.upload.v1.FileService/ListCollaborators",
    "serentak.upload.v1.FileService/ListSharedWithMe",
    "serentak.upload.v1.FileService/Download",
    "serentak.locks.v1.LockService/Release",
    "serentak.locks.v1.LockService/Describe",
)
# wait_finished: the call's deadline is the wait plus this, so the server's answer (at the
# wait's end, at the latest) arrives first; an unfinished answer sooner than this says the
# server did not wait.
_WAIT_GRACE_SECONDS = 10.0
_NOT_WAITED_SECONDS = 1.0
_FINISHED = (
    upload_pb2.UPLOAD_STATUS_COMPLETED,
    upload_pb2.UPLOAD_STATUS_FAILED,
    upload_pb2.UPLOAD_STATUS_ABORTED,
    upload_pb2.UPLOAD_STATUS_EXPIRED,
)


class SerentakClient(FileCalls):
    """Async client for one user (or service) of Serentak.

    `address` is the upload service (UploadService + FileService); `locks_address` and
    `notify_address` are needed only for `hold` and `subscribe`. Each address may be a list
    of IPs (`10.0.0.1:50052,10.0.0.2:50052`); over TLS its `*tls_server_name` is then the
    name the replicas' certificates carry (verified instead of the address). Use as an
    async context manager, or call `close()`.
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        locks_address: str | None = None,
        notify_address: str | None = None,
        security: ClientSecurity | None = None,
        tls_server_name: str = "",
        locks_tls_server_name: str = "",
        notify_tls_server_name: str = "",
    ) -> None:
        base = security or user_client_security(token, ca_file, cert_file, key_file)
        names = {
            "upload": tls_server_name,
            "locks": locks_tls_server_name,
            "notify": notify_tls_server_name,
        }
        # Per service: each verifies its own name (a ConfigError now, not at the first call).
        self._securities = {which: base.with_server_name(name) for which, name in names.items()}
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[tuple[Any, str], Any] = {}
        self._lock_clients: dict[str, LockClient] = {}  # by owner, over the locks channel
        self._addresses = {"upload": address, "locks": locks_address, "notify": notify_address}

    def _channel(self, which: str) -> grpc.aio.Channel:
        if which not in self._channels:
            address = self._addresses[which]
            if not address:
                raise ValueError(f"no {which} address given to SerentakClient")
            self._channels[which] = open_channel(
                address,
                self._securities[which],
                retry=_RETRY,
                options=[
                    ("grpc.max_send_message_length", _MESSAGE_LIMIT),
                    ("grpc.max_receive_message_length", _MESSAGE_LIMIT),
                ],
            )
        return self._channels[which]

    def _stub(self, stub_class: Callable[[grpc.aio.Channel], _Stub], which: str) -> _Stub:
        """`stub_class` over the `which` channel, made once: a stub builds a callable per
        method, which a call a small file makes should not pay again."""
        key = (stub_class, which)
        if key not in self._stubs:
            self._stubs[key] = stub_class(self._channel(which))
        stub: _Stub = self._stubs[key]
        return stub

    @property
    def uploads(self) -> upload_pb2_grpc.UploadServiceStub:
        """The raw UploadService stub."""
        return self._stub(upload_pb2_grpc.UploadServiceStub, "upload")

    @property
    def files(self) -> upload_pb2_grpc.FileServiceStub:
        """The raw FileService stub."""
        return self._stub(upload_pb2_grpc.FileServiceStub, "upload")

    async def close(self) -> None:
        """Close every channel opened so far."""
        lock_clients, self._lock_clients = list(self._lock_clients.values()), {}
        for lock_client in lock_clients:
            await lock_client.close()
        channels, self._channels = list(self._channels.values()), {}
        self._stubs = {}  # over the channels closed here
        for channel in channels:
            await channel.close()

    async def __aenter__(self) -> SerentakClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- uploads ------------------------------------------------------------------

    async def create_upload(
        self,
        path: Path,
        *,
        folder_id: str = "",
        name: str | None = None,
        to_file_id: str = "",
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        client_request_id: str | None = None,
    ) -> Upload:
        """Create (or, with the same request id, find again) the upload of `path`.

        `to_file_id` uploads a new version of that file; otherwise a new file `name`
        (default: the path's name) in `folder_id` (default: your root). The default
        request id is `upload_request_id(path, chunk_size, target)`: re-running after a
        crash finds the same upload.
        """
        if chunk_size < 1:
            raise ValueError("chunk_size must be at least 1 byte")
        size = path.stat().st_size
        request = upload_pb2.CreateUploadRequest(
            total_chunks=chunk_count(size, chunk_size), total_size=size, chunk_size=chunk_size
        )
        if to_file_id:
            request.file_id = to_file_id
            target = f"file:{to_file_id}"
        else:
            request.new_file.folder_id = folder_id
            request.new_file.name = name or path.name
            target = f"folder:{folder_id}/{request.new_file.name}"
        request.client_request_id = client_request_id or upload_request_id(path, chunk_size, target)
        return Named(await self.uploads.CreateUpload(request))

    async def get_upload(self, upload_id: str, *, wait_seconds: float = 0.0) -> Upload:
        """One of your uploads. `wait_seconds` > 0: answered once it has finished
        (completed, failed, aborted, expired), or as it is after that long (the server
        waits; its own limit may be shorter)."""
        if wait_seconds <= 0:
            return Named(
                await self.uploads.GetUpload(upload_pb2.GetUploadRequest(upload_id=upload_id))
            )
        waited: upload_pb2.Upload = await self.uploads.GetUpload(
            upload_pb2.GetUploadRequest(
                upload_id=upload_id, wait_finished_ms=max(1, int(wait_seconds * 1000))
            ),
            timeout=wait_seconds + _WAIT_GRACE_SECONDS,
        )
        return Named(waited)

    async def list_uploads(self, status: int | str = 0) -> list[Upload]:
        """Your uploads (all pages), optionally only those in `status` (a number or a
        name such as `uploading`)."""
        if isinstance(status, str):
            status = int(UploadStatus[status.upper()])
        out: list[Upload] = []
        token = ""
        while True:
            page = await self.uploads.ListUploads(
                upload_pb2.ListUploadsRequest(status=status, page_token=token)  # type: ignore[arg-type]
            )
            out.extend(Named(u) for u in page.uploads)
            token = page.next_page_token
            if not token:
                return out

    async def abort_upload(self, upload_id: str) -> Upload:
        """Abort an open upload."""
        return Named(
            await self.uploads.AbortUpload(upload_pb2.AbortUploadRequest(upload_id=upload_id))
        )

    async def send_missing(
        self,
        upload: Upload | upload_pb2.Upload,
        path: Path,
        *,
        parallel: int = 4,
        progress: ProgressCallback | None = None,
    ) -> None:
        """Send the chunks of `path` the server still misses (from a fresh GetUpload)."""
        state = await self.get_upload(upload.upload_id)
        if state.status != upload_pb2.UPLOAD_STATUS_UPLOADING:
            return
        size, chunk = state.total_size, state.chunk_size
        if path.stat().st_size != size:
            raise ValueError(f"{path} is {path.stat().st_size} bytes; the upload expects {size}")
        todo = [i for r in state.missing_ranges for i in range(r.start, r.end)]
        done = size - sum(chunk_length(i, chunk, size) for i in todo)
        if progress:
            progress(done, size)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in todo:
            queue.put_nowait(i)

        async def sender() -> None:
            nonlocal done
            with open(path, "rb") as f:
                while not queue.empty():
                    i = queue.get_nowait()
                    f.seek(i * chunk)
                    data = f.read(chunk)
                    await self.uploads.PutChunk(
                        upload_pb2.PutChunkRequest(
                            upload_id=state.upload_id,
                            chunk_index=i,
                            data=data,
                            checksum=hashlib.sha256(data).hexdigest(),
                        )
                    )
                    done += len(data)
                    if progress:
                        progress(done, size)

        await asyncio.gather(*(sender() for _ in range(max(1, parallel))))

    async def wait_finished(
        self, upload_id: str, poll_seconds: float = 0.2, wait_seconds: float = 30.0
    ) -> Upload:
        """Wait until the upload leaves uploading/merging; UploadFailed unless completed.

        The server waits: one GetUpload with `wait_finished_ms` is answered the moment the
        upload finishes (the merge committed), and is asked again only when its wait
        (`wait_seconds`, or the server's shorter limit) ran out. `poll_seconds` is the
        pause before asking again when a server answers an unfinished upload at once
        instead (a server from before the wait, or one at its UPLOAD_WAITER_LIMIT).
        """
        while True:
            asked = time.monotonic()
            try:
                state = await self.get_upload(upload_id, wait_seconds=wait_seconds)
            except grpc.aio.AioRpcError as exc:
                if rpc_reason(exc)[0] != "UPLOAD_WAITER_LIMIT":
                    raise
                await asyncio.sleep(poll_seconds)
                continue
            if state.status in _FINISHED:
                break
            if wait_seconds <= 0 or time.monotonic() - asked < min(
                _NOT_WAITED_SECONDS, wait_seconds / 2
            ):
                await asyncio.sleep(poll_seconds)
        if state.status != upload_pb2.UPLOAD_STATUS_COMPLETED:
            raise UploadFailed(state)
        return state

    async def upload(
        self,
        path: Path,
        *,
        folder_id: str = "",
        name: str | None = None,
        to_file_id: str = "",
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        parallel: int = 4,
        resume_upload_id: str = "",
        progress: ProgressCallback | None = None,
        on_created: Callable[[Upload], None] | None = None,
    ) -> Upload:
        """Upload `path` (create or resume, send what is missing, wait for the merge).

        A file that fits in one chunk (at most `chunk_size` bytes) goes in one `UploadFile`
        request, which answers once the version is committed: no CreateUpload, no chunks,
        no polling (a server without UploadFile gets the chunked flow). Otherwise:
        `resume_upload_id` continues that upload (its target and layout), else see
        `create_upload`. `on_created` gets the upload as soon as it exists (to print its
        id for a later resume; after an UploadFile, the completed one). Returns the
        completed upload (file_id, file_version).
        """
        if not resume_upload_id and path.stat().st_size <= chunk_size:
            done = await self._upload_in_one_request(
                path, folder_id=folder_id, name=name, to_file_id=to_file_id
            )
            if done is not None:
                if on_created:
                    on_created(done)
                if progress:
                    progress(done.total_size, done.total_size)
                return done
        if resume_upload_id:
            upload = await self.get_upload(resume_upload_id)
        else:
            upload = await self.create_upload(
                path, folder_id=folder_id, name=name, to_file_id=to_file_id, chunk_size=chunk_size
            )
        if on_created:
            on_created(upload)
        await self.send_missing(upload, path, parallel=parallel, progress=progress)
        return await self.wait_finished(upload.upload_id)

    async def upload_file(
        self,
        data: bytes,
        *,
        folder_id: str = "",
        name: str = "",
        to_file_id: str = "",
        client_request_id: str = "",
    ) -> Named[upload_pb2.UploadFileResponse]:
        """`data` (at most the server's max chunk size) as a new file `name` in `folder_id`
        (default: your root) or a new version of `to_file_id`, in one request: the answer
        carries the completed upload and the file at the version it committed. Repeating it
        with the same `client_request_id` returns the same upload, never a second version."""
        request = upload_pb2.UploadFileRequest(
            client_request_id=client_request_id,
            data=data,
            checksum=hashlib.sha256(data).hexdigest(),
        )
        if to_file_id:
            request.file_id = to_file_id
        else:
            request.new_file.folder_id = folder_id
            request.new_file.name = name
        return Named(await self.uploads.UploadFile(request))

    async def _upload_in_one_request(
        self, path: Path, *, folder_id: str, name: str | None, to_file_id: str
    ) -> Upload | None:
        """`upload` of a one-chunk file by UploadFile; None if the server lacks it."""
        with open(path, "rb") as f:
            data = f.read()
        target = f"file:{to_file_id}" if to_file_id else f"folder:{folder_id}/{name or path.name}"
        # Not the chunked flow's id: the same file sent by CreateUpload is another request.
        crid = upload_request_id(path, len(data), f"upload-file:{target}")
        try:
            answer = await self.upload_file(
                data,
                folder_id=folder_id,
                name=name or path.name,
                to_file_id=to_file_id,
                client_request_id=crid,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            reason, metadata = rpc_reason(exc)
            if reason == "MERGE_PENDING" and metadata.get("upload_id"):
                # Committed without this call (the runtime took the merge): wait for it.
                return await self.wait_finished(metadata["upload_id"])
            raise
        return Named(answer.upload)

    # -- files (FileService calls: serentak.sdk.files) -----------------------------

    async def download(
        self,
        file_id: str,
        dest: Path,
        *,
        version: int = 0,
        progress: ProgressCallback | None = None,
    ) -> DownloadResult:
        """Download a file's current content (or kept content `version`, a number
        `versions()` lists) to `dest`, atomically and verified.

        The bytes go to a temporary file in `dest`'s directory, renamed over `dest` only
        after the sha256 matched the server's trailing checksum; on any error nothing is
        left behind. FileNotFoundError for a missing directory; ChecksumMismatch; a version
        the file never had is NOT_FOUND / VERSION_NOT_FOUND, one past retention
        FAILED_PRECONDITION / VERSION_PURGED.
        """
        size = 0
        if progress:
            size = (await self.get_file(file_id)).size
            if version:
                size = next(
                    (v.size for v in await self.versions(file_id) if v.version == version), 0
                )
        digest = hashlib.sha256()
        done = 0
        if progress:
            progress(0, size)
        with atomic_destination(dest) as f:
            call = self.files.Download(upload_pb2.DownloadRequest(file_id=file_id, version=version))
            async for block in call:
                f.write(block.data)
                digest.update(block.data)
                done += len(block.data)
                if progress:
                    progress(done, max(size, done))
            trailing = dict(await call.trailing_metadata() or ())
            algorithm = str(trailing.get("x-checksum-algorithm", ""))
            expected = str(trailing.get("x-checksum", ""))
            verified = algorithm == "sha256" and bool(expected)
            if verified and expected != digest.hexdigest():
                raise ChecksumMismatch(
                    f"file {file_id}: received sha256 {digest.hexdigest()}, server says {expected}"
                )
        return DownloadResult(dest, done, digest.hexdigest(), "sha256", verified)

    # -- locks and notifications ---------------------------------------------------

    def hold(
        self, key: str, *, owner: str = "sdk", ttl_seconds: int = 10, wait_timeout_ms: int = 0
    ) -> HeldLock:
        """`async with` this to hold `key` while the block runs (`serentak.sdk.locks`).

        A user's `key` lives in its own space, `user:{user_id}:{scope}` (e.g.
        `user:alice:report`); `file:` keys and other users' spaces are refused
        (PERMISSION_DENIED).

        Acquires (`LockHeld` when another holder keeps it past `wait_timeout_ms`), keeps its
        lease alive over a Hold stream and releases it on exit. The `HeldLock` has the
        fencing `token` (and the Lock message as `lock`): carry it into writes made under
        the lock. If the lock is lost meanwhile, the block is cancelled and the `async with`
        raises `LockLost`.
        """
        if owner not in self._lock_clients:
            self._lock_clients[owner] = LockClient(self._channel("locks"), owner=owner)
        return self._lock_clients[owner].hold(
            key, ttl=ttl_seconds, wait_timeout=wait_timeout_ms / 1000
        )

    async def describe_lock(self, key: str) -> locks_pb2.DescribeResponse:
        """The holder and waiters of `key`."""
        stub = self._stub(locks_pb2_grpc.LockServiceStub, "locks")
        described: locks_pb2.DescribeResponse = await stub.Describe(
            locks_pb2.DescribeRequest(key=key)
        )
        return described

    async def subscribe(
        self, cursor: str = "", *, device_id: str = "", max_batch: int = 0
    ) -> AsyncIterator[notify_pb2.SubscribeResponse]:
        """Your notifications after `cursor` (empty: from now on), then live ones.

        Keep the last `cursor` you saw and pass it again to resume without a gap. With
        `max_batch` above 1 (at most 64), notifications already waiting arrive together,
        in `notifications` rather than `notification`: fewer messages under load, no added
        latency. `notifications_in(message)` reads either shape.
        """
        stub = self._stub(notify_pb2_grpc.NotifyServiceStub, "notify")
        request = notify_pb2.SubscribeRequest(
            cursor=cursor, device_id=device_id, max_batch=max_batch
        )
        call = stub.Subscribe(request)
        try:
            async for message in call:
                yield message
        finally:
            call.cancel()


__all__: Sequence[str] = [
    "ChecksumMismatch",
    "DownloadResult",
    "ProgressCallback",
    "SerentakClient",
    "UploadFailed",
    "rpc_reason",
    "upload_request_id",
]
