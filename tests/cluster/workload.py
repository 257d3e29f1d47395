"""The cluster test's clients: users' devices and a lock-holding service, each call spread
over both replicas of a service and failed over on UNAVAILABLE, over TLS with the
deployment's tokens.

Workload: 10 files created by alice and shared with bob and carol, then 40 more uploads (4
per file) whose chunks are each sent twice at once, through both upload replicas; one
rename per file; Subscribe streams for bob and carol on both notify replicas; a lock loop
on three keys through both lock replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from serentak.channels import open_channel
from serentak.credentials import ClientSecurity
from serentak.locks.v1 import locks_pb2
from serentak.notify.v1 import notify_pb2
from serentak.upload.v1 import upload_pb2

FILES = 10
MORE_VERSIONS = 4  # uploads per file after the first: 10 + 40 = 50 uploads
CHUNK = 256 * 1024  # the guide keeps the default smallest chunk (SERENTAK_MIN_CHUNK_SIZE)
DEADLINE_S = 180.0
CHAOS_AFTER = 15  # main-phase uploads completed before the kills
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
Metadata = tuple[tuple[str, str], ...]


def bearer(token: str) -> Metadata:
    """The call metadata carrying `token`."""
    return (("authorization", f"Bearer {token}"),)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Tally:
    """What the clients saw: error codes by RPC, and the counts printed at the end."""

    errors: Counter[str] = field(default_factory=Counter)
    failovers: int = 0

    def saw(self, method: str, exc: grpc.aio.AioRpcError) -> None:
        self.errors[f"{method}:{exc.code().name}"] += 1


class Replicas:
    """Stubs of one service on each of its replicas; `call` spreads and fails over."""

    def __init__(
        self, addresses: list[str], stub_cls: Any, tally: Tally, security: ClientSecurity
    ) -> None:
        self.channels = [open_channel(a, security) for a in addresses]
        self.stubs = [stub_cls(c) for c in self.channels]
        self.tally = tally
        self._next = 0

    async def close(self) -> None:
        for c in self.channels:
            await c.close()

    async def call(
        self, method: str, request: Any, metadata: Metadata, *, prefer: int | None = None
    ) -> Any:
        """Call `method` on one replica (round robin, or `prefer`); on UNAVAILABLE or a
        deadline, try the other, until DEADLINE_S. Only idempotent calls come here."""
        start = self._next if prefer is None else prefer
        self._next += 1
        deadline = time.monotonic() + DEADLINE_S
        attempt = 0
        while True:
            stub = self.stubs[(start + attempt) % len(self.stubs)]
            try:
                return await getattr(stub, method)(request, metadata=metadata, timeout=20)
            except grpc.aio.AioRpcError as exc:
                self.tally.saw(method, exc)
                if exc.code() not in RETRYABLE or time.monotonic() > deadline:
                    raise
                self.tally.failovers += 1
            attempt += 1
            await asyncio.sleep(min(0.05 * attempt, 0.5))  # backoff between replicas


@dataclass
class Stream:
    """One user's device: a Subscribe stream that resumes from its cursor on the other
    replica whenever its replica goes away."""

    user: str
    token: str
    device: str
    first: int
    got: list[notify_pb2.Notification] = field(default_factory=list)
    cursor: str = "0"
    hops: int = 0

    async def run(self, notify: Replicas) -> None:
        replica = self.first
        while True:
            call = notify.stubs[replica].Subscribe(
                notify_pb2.SubscribeRequest(cursor=self.cursor, device_id=self.device),
                metadata=bearer(self.token),
            )
            try:
                async for item in call:
                    if item.HasField("notification"):
                        self.got.append(item.notification)
                    self.cursor = item.cursor or self.cursor
            except grpc.aio.AioRpcError as exc:
                notify.tally.saw("Subscribe", exc)
                if exc.code() not in RETRYABLE | {grpc.StatusCode.RESOURCE_EXHAUSTED}:
                    raise
            replica = (replica + 1) % len(notify.stubs)
            self.hops += 1
            await asyncio.sleep(0.1)  # reconnect backoff


@dataclass
class World:
    upload: Replicas
    files: Replicas
    notify: Replicas
    tally: Tally
    alice: Metadata
    uploads: dict[str, bytes] = field(default_factory=dict)  # upload_id -> bytes
    upload_file: dict[str, str] = field(default_factory=dict)  # upload_id -> file_id
    versions: dict[str, int] = field(default_factory=dict)  # upload_id -> file_version
    renames: dict[str, int] = field(default_factory=dict)  # file_id -> version
    last_bytes: dict[str, bytes] = field(default_factory=dict)
    completed_main: int = 0
    chaos_started: asyncio.Event = field(default_factory=asyncio.Event)
    # What the database is doing, for the message of a stuck upload.
    diagnose: Callable[[], str] = lambda: ""

    async def upload_once(self, data: bytes, *, file_id: str = "", name: str = "") -> str:
        """CreateUpload, then every chunk twice at once through both replicas."""
        pieces = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
        request = upload_pb2.CreateUploadRequest(
            total_chunks=len(pieces),
            total_size=len(data),
            chunk_size=CHUNK,
            client_request_id=uuid.uuid4().hex,
        )
        if file_id:
            request.file_id = file_id
        else:
            request.new_file.CopyFrom(upload_pb2.NewFileTarget(name=name))
        created = await self.upload.call("CreateUpload", request, self.alice)

        async def put(index: int, replica: int) -> None:
            piece = pieces[index]
            req = upload_pb2.PutChunkRequest(
                upload_id=created.upload_id, chunk_index=index, data=piece, checksum=sha(piece)
            )
            await self.upload.call("PutChunk", req, self.alice, prefer=replica)

        order = list(range(len(pieces)))
        random.shuffle(order)
        await asyncio.gather(*(put(i, r) for i in order for r in (0, 1)))
        self.uploads[created.upload_id] = data
        return str(created.upload_id)

    async def completed(self, upload_id: str) -> upload_pb2.Upload:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            got = await self.upload.call(
                "GetUpload", upload_pb2.GetUploadRequest(upload_id=upload_id), self.alice
            )
            if got.status == upload_pb2.UPLOAD_STATUS_COMPLETED:
                self.upload_file[upload_id] = got.file_id
                self.versions[upload_id] = got.file_version
                return got
            assert got.status != upload_pb2.UPLOAD_STATUS_FAILED, got.failure_reason
            assert time.monotonic() < deadline, (
                f"upload {upload_id} stuck in {got.status}; database: {self.diagnose()}"
            )
            await asyncio.sleep(0.1)  # GetUpload poll period

    async def rename(self, file_id: str, name: str) -> None:
        """Rename guarded by expected_version: a retried call cannot apply twice."""
        get = upload_pb2.GetFileRequest(file_id=file_id)
        current = await self.files.call("GetFile", get, self.alice)
        request = upload_pb2.RenameFileRequest(
            file_id=file_id, new_name=name, expected_version=current.version
        )
        try:
            renamed = await self.files.call("RenameFile", request, self.alice)
            version = renamed.version
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.ABORTED:
                raise
            # Our first attempt did commit before its replica died: read what it made.
            again = await self.files.call("GetFile", get, self.alice)
            assert again.name == name, again
            version = current.version + 1
        self.renames[file_id] = version

    async def file_life(self, n: int) -> None:
        """One file: created, shared (bob, carol), MORE_VERSIONS uploads, one rename."""
        data = os.urandom(2 * CHUNK + 1000 + n)
        first = await self.upload_once(data, name=f"cluster-{n}.bin")
        file_id = (await self.completed(first)).file_id
        for user, role in (("bob", upload_pb2.ROLE_EDITOR), ("carol", upload_pb2.ROLE_VIEWER)):
            await self.files.call(
                "ShareFile",
                upload_pb2.ShareFileRequest(file_id=file_id, user_id=user, role=role),
                self.alice,
            )
        for v in range(MORE_VERSIONS):
            data = os.urandom(CHUNK + 500 * (v + 1) + n)
            upload_id = await self.upload_once(data, file_id=file_id)
            await self.completed(upload_id)
            self.last_bytes[file_id] = data
            self.completed_main += 1
            if self.completed_main >= CHAOS_AFTER:
                self.chaos_started.set()
            if v == 1:
                await self.rename(file_id, f"renamed-{n}.bin")


async def lock_loop(locks: Replicas, key: str, token: str, stop: asyncio.Event) -> list[int]:
    """Acquire/release `key` over and over through both lock replicas, as a service
    holding `token`; the fencing tokens granted, in order."""
    tokens: list[int] = []
    owner = f"cluster-{key}"
    while not stop.is_set():
        request = locks_pb2.AcquireRequest(
            key=key, owner=owner, ttl_seconds=3, wait_timeout_ms=10_000, tenant_id="acme"
        )
        try:
            lock = await locks.call("Acquire", request, bearer(token))
        except grpc.aio.AioRpcError as exc:
            # A lost Acquire answer leaves our key until its 3 s lease ends: LOCK_HELD.
            if exc.code() == grpc.StatusCode.ABORTED:
                continue
            raise
        tokens.append(lock.token)
        with contextlib.suppress(grpc.aio.AioRpcError):
            await locks.call(
                "Release",
                locks_pb2.ReleaseRequest(key=key, token=lock.token, tenant_id="acme"),
                bearer(token),
            )
        await asyncio.sleep(0.05)  # pacing, not synchronisation
    return tokens


def first_uploads(world: World) -> list[str]:
    """The uploads that created their file (before any share: nobody is told of them)."""
    by_file: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for upload_id, file_id in world.upload_file.items():
        by_file[file_id].append((world.versions[upload_id], upload_id))
    return [min(v)[1] for v in by_file.values()]


async def list_all(notify: Replicas, token: str) -> list[notify_pb2.Notification]:
    out: list[notify_pb2.Notification] = []
    page_token = ""
    while True:
        page = await notify.call(
            "ListNotifications",
            notify_pb2.ListNotificationsRequest(page_size=500, page_token=page_token),
            bearer(token),
        )
        out.extend(page.notifications)
        page_token = page.next_page_token
        if not page_token:
            return out


async def download(files: Replicas, file_id: str, metadata: Metadata) -> bytes:
    for attempt in range(20):
        stub = files.stubs[attempt % 2]
        try:
            call = stub.Download(upload_pb2.DownloadRequest(file_id=file_id), metadata=metadata)
            return b"".join([chunk.data async for chunk in call])
        except grpc.aio.AioRpcError as exc:
            files.tally.saw("Download", exc)
            if exc.code() not in RETRYABLE:
                raise
    raise AssertionError("no replica could serve the download")
