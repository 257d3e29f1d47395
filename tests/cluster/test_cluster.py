"""The whole system as production runs it, on 127.0.0.1: PostgreSQL, a 3-member etcd
cluster over TLS with auth, an S3-compatible store (s3s-fs), and two replicas of each
service. Clients spread calls over both replicas and fail over on UNAVAILABLE.

Workload: 10 files created by alice and shared with bob and carol, then 40 more uploads
(4 per file) whose chunks are each sent twice at once, through both upload replicas; one
rename per file; Subscribe streams for bob and carol on both notify replicas; a lock
loop on three keys through both lock replicas. Mid-run one upload, one notify and one
lock replica and the etcd leader are SIGKILLed, then restarted.

Asserted: every upload completed exactly once (one content event per upload) with the
right bytes in the store; no object in the store that the database does not account for;
every stream got each (file, version) of its user exactly once and the same set the
database holds, including each content version and rename; no INTERNAL anywhere; fencing
tokens strictly increasing per key. The counts are printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import os
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from sqlalchemy import create_engine, text
from support.etcd import EtcdCluster
from support.s3 import S3Server
from support.services import ServiceProcess, service_process

from services.common.db import sync_url

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.etcd]

FILES = 10
MORE_VERSIONS = 4  # uploads per file after the first: 10 + 40 = 50 uploads
CHUNK = 16 * 1024
DEADLINE_S = 180.0
CHAOS_AFTER = 15  # main-phase uploads completed before the kills
SERVICE_TOKEN = "dev-service-upload"  # the upload principal may lock file: keys
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def md(user: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer dev-{user}"),)


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
    """Stubs of one service on both replicas; `call` spreads and fails over."""

    def __init__(self, addresses: list[str], stub_cls: Any, tally: Tally) -> None:
        self.channels = [grpc.aio.insecure_channel(a) for a in addresses]
        self.stubs = [stub_cls(c) for c in self.channels]
        self.tally = tally
        self._next = 0

    async def close(self) -> None:
        for c in self.channels:
            await c.close()

    async def call(
        self, method: str, request: Any, metadata: Any, *, prefer: int | None = None
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
                metadata=md(self.user),
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
    locks: Replicas
    tally: Tally
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
        created = await self.upload.call("CreateUpload", request, md("alice"))

        async def put(index: int, replica: int) -> None:
            piece = pieces[index]
            req = upload_pb2.PutChunkRequest(
                upload_id=created.upload_id, chunk_index=index, data=piece, checksum=sha(piece)
            )
            await self.upload.call("PutChunk", req, md("alice"), prefer=replica)

        order = list(range(len(pieces)))
        random.shuffle(order)
        await asyncio.gather(*(put(i, r) for i in order for r in (0, 1)))
        self.uploads[created.upload_id] = data
        return created.upload_id

    async def completed(self, upload_id: str) -> upload_pb2.Upload:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            got = await self.upload.call(
                "GetUpload", upload_pb2.GetUploadRequest(upload_id=upload_id), md("alice")
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
        current = await self.files.call(
            "GetFile", upload_pb2.GetFileRequest(file_id=file_id), md("alice")
        )
        request = upload_pb2.RenameFileRequest(
            file_id=file_id, new_name=name, expected_version=current.version
        )
        try:
            renamed = await self.files.call("RenameFile", request, md("alice"))
            version = renamed.version
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.ABORTED:
                raise
            # Our first attempt did commit before its replica died: read what it made.
            again = await self.files.call(
                "GetFile", upload_pb2.GetFileRequest(file_id=file_id), md("alice")
            )
            assert again.name == name, again
            version = current.version + 1
        self.renames[file_id] = version

    async def file_life(self, n: int) -> None:
        """One file: created, shared (bob, carol), MORE_VERSIONS uploads, one rename."""
        data = os.urandom(3 * CHUNK + 1000 + n)
        first = await self.upload_once(data, name=f"cluster-{n}.bin")
        file_id = (await self.completed(first)).file_id
        for user, role in (("bob", upload_pb2.ROLE_EDITOR), ("carol", upload_pb2.ROLE_VIEWER)):
            await self.files.call(
                "ShareFile",
                upload_pb2.ShareFileRequest(file_id=file_id, user_id=user, role=role),
                md("alice"),
            )
        for v in range(MORE_VERSIONS):
            data = os.urandom(2 * CHUNK + 500 * (v + 1) + n)
            upload_id = await self.upload_once(data, file_id=file_id)
            await self.completed(upload_id)
            self.last_bytes[file_id] = data
            self.completed_main += 1
            if self.completed_main >= CHAOS_AFTER:
                self.chaos_started.set()
            if v == 1:
                await self.rename(file_id, f"renamed-{n}.bin")


async def lock_loop(locks: Replicas, key: str, stop: asyncio.Event) -> list[int]:
    """Acquire/release `key` over and over through both lock replicas; the tokens granted,
    in order."""
    tokens: list[int] = []
    owner = f"cluster-{key}"
    while not stop.is_set():
        request = locks_pb2.AcquireRequest(
            key=key, owner=owner, ttl_seconds=3, wait_timeout_ms=10_000, tenant_id="acme"
        )
        try:
            lock = await locks.call(
                "Acquire", request, (("authorization", f"Bearer {SERVICE_TOKEN}"),)
            )
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
                (("authorization", f"Bearer {SERVICE_TOKEN}"),),
            )
        await asyncio.sleep(0.05)  # pacing, not synchronisation
    return tokens


def store_keys(s3: S3Server, prefix: str) -> list[str]:
    """Every object key under `prefix` in s3s-fs's folder (its own metadata files aside)."""
    root = s3.object_path(prefix)
    keys = []
    for path in root.rglob("*"):
        if path.is_file():
            keys.append(path.relative_to(root).as_posix())
    return sorted(keys)


@pytest.fixture
def s3_server(s3_factory) -> S3Server:
    """A private s3s-fs (its folder is inspected for orphans at the end)."""
    return s3_factory()


async def test_two_replicas_of_everything_survive_kills(
    postgres, etcd_cluster: EtcdCluster, s3_server: S3Server, tmp_path: Path
) -> None:
    started = time.monotonic()
    cluster = etcd_cluster
    upload_db, notify_db = postgres.create(), postgres.create()
    prefix = f"cluster-{uuid.uuid4().hex[:8]}"
    fast = {
        "SERENTAK_LOG_LEVEL": "INFO",
        "SERENTAK_WORKER_LEASE_SECONDS": "4",
        "SERENTAK_WORKER_POLL_SECONDS": "0.1",
        "SERENTAK_READINESS_INTERVAL_SECONDS": "1",
    }
    procs: dict[str, ServiceProcess] = {}
    with contextlib.ExitStack() as stack:

        def launch(name: str, i: int, env: dict[str, str], port: int | None = None) -> None:
            folder = tmp_path / f"{name}{i}-{time.monotonic_ns()}"
            folder.mkdir()
            procs[f"{name}{i}"] = stack.enter_context(
                service_process(name, folder, {**fast, **env}, port=port)
            )

        for i in range(2):
            launch("locks", i, {**cluster.env(), "SERENTAK_LOCK_PREFIX": f"/{prefix}/"})
        for i in range(2):
            launch("notify", i, {"SERENTAK_NOTIFY_DATABASE_URL": notify_db})

        def upload_env(i: int) -> dict[str, str]:
            return {
                **s3_server.env(prefix),
                "SERENTAK_UPLOAD_DATABASE_URL": upload_db,
                # Both replicas, round robin (services.common.channels): the first
                # listed differs per upload replica, so both are in use from the start.
                "SERENTAK_LOCKS_ADDRESS": ",".join(
                    procs[f"locks{(i + k) % 2}"].address for k in range(2)
                ),
                "SERENTAK_NOTIFY_ADDRESS": ",".join(
                    procs[f"notify{(i + k) % 2}"].address for k in range(2)
                ),
                "SERENTAK_MIN_CHUNK_SIZE": "1024",
                "SERENTAK_MERGE_RETRY_BASE_SECONDS": "0.2",
                "SERENTAK_MERGE_RETRY_CAP_SECONDS": "2",
                "SERENTAK_MERGE_MAX_ATTEMPTS": "30",
                "SERENTAK_MERGE_LOCK_TTL_SECONDS": "5",
            }

        for i in range(2):
            launch("upload", i, upload_env(i))
        tally = Tally()
        addresses = {
            n: [procs[f"{n}{i}"].address for i in range(2)] for n in ("upload", "notify", "locks")
        }
        world = World(
            upload=Replicas(addresses["upload"], upload_pb2_grpc.UploadServiceStub, tally),
            files=Replicas(addresses["upload"], upload_pb2_grpc.FileServiceStub, tally),
            notify=Replicas(addresses["notify"], notify_pb2_grpc.NotifyServiceStub, tally),
            locks=Replicas(addresses["locks"], locks_pb2_grpc.LockServiceStub, tally),
            tally=tally,
            diagnose=lambda: activity(upload_db),
        )
        streams = [
            Stream("bob", "bob-a", 0),
            Stream("bob", "bob-b", 1),
            Stream("carol", "carol-b", 1),
            Stream("carol", "carol-a", 0),
        ]
        readers = [asyncio.create_task(s.run(world.notify)) for s in streams]
        stop_locks = asyncio.Event()
        lockers = [
            asyncio.create_task(lock_loop(world.locks, f"file:cluster-{k}", stop_locks))
            for k in range(3)
        ]
        kills: list[str] = []

        async def chaos() -> None:
            await world.chaos_started.wait()
            leader = await asyncio.to_thread(cluster.leader)
            victims = [procs["upload0"], procs["notify0"], procs["locks0"]]
            for svc in victims:
                svc.process.kill()
                svc.process.wait()
            cluster.kill(leader)
            kills.extend(["upload0", "notify0", "locks0", f"etcd-leader-m{leader}"])
            await asyncio.to_thread(cluster.start, leader)
            for name, svc in (("locks", victims[2]), ("notify", victims[1])):
                env = (
                    {**cluster.env(), "SERENTAK_LOCK_PREFIX": f"/{prefix}/"}
                    if name == "locks"
                    else {"SERENTAK_NOTIFY_DATABASE_URL": notify_db}
                )
                await asyncio.to_thread(launch, name, 0, env, svc.port)
            await asyncio.to_thread(launch, "upload", 0, upload_env(0), victims[0].port)

        chaos_task = asyncio.create_task(chaos())
        try:
            await asyncio.gather(*(world.file_life(n) for n in range(FILES)))
            await asyncio.wait_for(chaos_task, DEADLINE_S)
            stop_locks.set()
            tokens = await asyncio.gather(*lockers)

            # Notifications: wait until every stream holds what the database holds.
            expected: dict[str, set[tuple[str, int]]] = {}
            deadline = time.monotonic() + DEADLINE_S
            for user in ("bob", "carol"):
                while True:
                    listed = await list_all(world.notify, user)
                    keys = {(n.file_id, n.version) for n in listed}
                    must = {(world.upload_file[u], v) for u, v in world.versions.items()}
                    must -= {
                        (world.upload_file[u], world.versions[u]) for u in first_uploads(world)
                    }
                    must |= set(world.renames.items())
                    if must <= keys and all(
                        {(n.file_id, n.version) for n in s.got} >= keys
                        for s in streams
                        if s.user == user
                    ):
                        expected[user] = keys
                        break
                    assert time.monotonic() < deadline, (user, sorted(must - keys))
                    await asyncio.sleep(0.2)  # poll until delivered, bounded
            for s in streams:
                delivered = [(n.file_id, n.version) for n in s.got]
                dupes = [k for k, c in Counter(delivered).items() if c > 1]
                assert not dupes, f"{s.device} got {dupes} twice"
                assert set(delivered) == expected[s.user], s.device
                cursors = [int(n.cursor) for n in s.got]
                assert cursors == sorted(cursors), f"{s.device} out of order"

            # Bytes: each file's current content via Download, and every version's object.
            for file_id, data in world.last_bytes.items():
                assert await download(world.files, file_id) == data
            check_database_and_store(world, upload_db, s3_server, prefix)
        finally:
            for task in [*readers, *lockers, chaos_task]:
                task.cancel()
            for r in (world.upload, world.files, world.notify, world.locks):
                await r.close()
        for key_tokens in tokens:
            assert key_tokens, "a lock loop never acquired"
            assert all(a < b for a, b in itertools.pairwise(key_tokens)), key_tokens
        internal = [k for k in tally.errors if k.endswith(":INTERNAL")]
        assert not internal, tally.errors
        logs = {name: p.log_text() for name, p in procs.items()}
    assert all('"rpc_completed"' in t for t in logs.values()), "log format changed?"
    for name, text_ in logs.items():
        assert '"code": "INTERNAL"' not in text_, f"{name} answered INTERNAL"
        assert '"rpc_bug"' not in text_, f"{name} hit a bug"
    print(
        f"\ncluster: {len(world.uploads)} uploads completed once each, "
        f"{len(world.renames)} renames, {sum(len(s.got) for s in streams)} stream deliveries "
        f"over {len(streams)} streams ({sum(s.hops for s in streams)} reconnects), "
        f"lock tokens {[len(t) for t in tokens]} per key, killed {kills}, "
        f"client failovers {tally.failovers}, errors seen {dict(tally.errors)}, "
        f"{time.monotonic() - started:.0f} s"
    )


def activity(url: str) -> str:
    """Open transactions and lock waits in the database at `url` (for failure messages)."""
    engine = create_engine(sync_url(url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT pid, state, wait_event_type, wait_event, now() - xact_start, "
                    "left(query, 200) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND state <> 'idle' "
                    "AND pid <> pg_backend_pid()"
                )
            ).all()
    finally:
        engine.dispose()
    return "; ".join(str(tuple(r)) for r in rows) or "no open transactions"


def first_uploads(world: World) -> list[str]:
    """The uploads that created their file (before any share: nobody is told of them)."""
    by_file: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for upload_id, file_id in world.upload_file.items():
        by_file[file_id].append((world.versions[upload_id], upload_id))
    return [min(v)[1] for v in by_file.values()]


async def list_all(notify: Replicas, user: str) -> list[notify_pb2.Notification]:
    out: list[notify_pb2.Notification] = []
    token = ""
    while True:
        page = await notify.call(
            "ListNotifications",
            notify_pb2.ListNotificationsRequest(page_size=500, page_token=token),
            md(user),
        )
        out.extend(page.notifications)
        token = page.next_page_token
        if not token:
            return out


async def download(files: Replicas, file_id: str) -> bytes:
    for attempt in range(20):
        stub = files.stubs[attempt % 2]
        try:
            call = stub.Download(upload_pb2.DownloadRequest(file_id=file_id), metadata=md("alice"))
            return b"".join([chunk.data async for chunk in call])
        except grpc.aio.AioRpcError as exc:
            files.tally.saw("Download", exc)
            if exc.code() not in RETRYABLE:
                raise
    raise AssertionError("no replica could serve the download")


def check_database_and_store(world: World, upload_db: str, s3: S3Server, prefix: str) -> None:
    """Exactly one content event per upload; every stored object accounted for and right."""
    engine = create_engine(sync_url(upload_db))
    try:
        with engine.connect() as conn:
            statuses = dict(conn.execute(text("SELECT id, status FROM uploads")).all())
            events = Counter(
                (aggregate_id, version)
                for aggregate_id, version in conn.execute(
                    text(
                        "SELECT aggregate_id, version FROM outbox_events "
                        "WHERE event_type = 'file.content.updated'"
                    )
                ).all()
            )
            chunks = {
                (u, i)
                for u, i in conn.execute(text("SELECT upload_id, chunk_index FROM upload_chunks"))
            }
    finally:
        engine.dispose()
    assert set(statuses) == set(world.uploads)
    assert set(statuses.values()) == {"completed"}
    for upload_id, file_id in world.upload_file.items():
        assert events[(file_id, world.versions[upload_id])] == 1, upload_id
    assert sum(events.values()) == len(world.uploads), "a merge committed twice"
    unexplained = []
    for key in store_keys(s3, prefix):
        parts = key.split("/")
        if parts[0] == "uploads" and len(parts) == 3 and (parts[1], int(parts[2])) in chunks:
            continue
        if parts[0] == "files" and len(parts) == 3 and world.upload_file.get(parts[2]) == parts[1]:
            with open(s3.object_path(f"{prefix}/{key}"), "rb") as f:
                assert sha(f.read()) == sha(world.uploads[parts[2]]), key
            continue
        unexplained.append(key)
    assert not unexplained, f"orphan or partial objects: {unexplained[:20]}"
    stored = {k.split("/")[2] for k in store_keys(s3, prefix) if k.startswith("files/")}
    assert stored == set(world.uploads), "a completed upload's object is missing"
