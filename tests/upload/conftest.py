"""Fixtures for the upload service: a real lock service (real etcd), the upload service
in-process on a fresh SQLite or PostgreSQL database, and per-user gRPC stubs.

Blobs live in the local store unless a test parametrizes `blob_backend` with "s3" (a
real S3-compatible server, s3s-fs); tests reach the bytes through `cluster.blobs`."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from serentak.upload.v1 import upload_pb2_grpc
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from support.services import running_app

from services.common.db import create_engine, session_factory
from services.common.jobs import RuntimeOptions
from services.locks.app import build_app as build_locks_app
from services.locks.settings import LocksSettings
from services.upload.app import build_app as build_upload_app
from services.upload.components import build_components
from services.upload.database import migrate
from services.upload.settings import UploadSettings
from services.upload.storage.blob_store import BlobStore, open_blob_store
from services.upload.sync.settings import SyncSettings

TOKENS = {"alice": "dev-alice", "bob": "dev-bob", "carol": "dev-carol", "mallory": "dev-mallory"}


@dataclass
class Client:
    """Stubs that call as one user."""

    uploads: upload_pb2_grpc.UploadServiceStub
    files: upload_pb2_grpc.FileServiceStub
    metadata: tuple[tuple[str, str], ...]

    def md(self, **extra: str) -> tuple[tuple[str, str], ...]:
        """The user's metadata plus extras (e.g. x-correlation-id)."""
        return self.metadata + tuple(extra.items())


@dataclass
class UploadCluster:
    """A running upload service (+ lock service) and clients for each dev user."""

    address: str
    settings: UploadSettings
    channel: grpc.aio.Channel
    # The service's blob store, opened again for the test (local folder or S3 prefix).
    blobs: BlobStore
    clients: dict[str, Client] = field(default_factory=dict)

    def __getitem__(self, user: str) -> Client:
        return self.clients[user]


@pytest.fixture
async def locks_address(etcd: Any) -> AsyncIterator[str]:
    """A real lock service on the session etcd, under a key prefix of its own."""
    settings = LocksSettings(etcd_endpoint=etcd.endpoint, lock_prefix=f"/t-{uuid.uuid4().hex}/")
    async with running_app(build_locks_app(settings)) as service:
        yield f"127.0.0.1:{service.app.bound_port}"


def upload_settings(
    database_url: str, tmp_path: Path, locks_address: str, **overrides: Any
) -> UploadSettings:
    """Test settings: small chunks allowed, data under tmp_path, fsync kept on."""
    values: dict[str, Any] = {
        "upload_database_url": database_url,
        "data_dir": tmp_path / "data",
        "locks_address": locks_address,
        "min_chunk_size": 1024,
        "merge_lock_wait_ms": 20_000,
        # No notify service here; the end-to-end test turns publishing on.
        "publish_events": False,
        # The job path is what these tests drive (workers they kill, dead letters...): a
        # small chunked upload's last chunk does not merge inline unless a test says so.
        "inline_merge_max_bytes": 0,
    }
    values.update(overrides)
    return UploadSettings(**values)


@pytest.fixture
def runtime_options() -> RuntimeOptions:
    """Fast-polling job runtime for tests."""
    return RuntimeOptions(
        node_id=f"test-{uuid.uuid4().hex[:6]}",
        concurrency=4,
        poll_interval=0.05,
        lease_seconds=10,
        stats_interval=60,
    )


@pytest.fixture
async def parts(database_url, tmp_path, locks_address, runtime_options):
    """The upload service's parts on a migrated database (no runtime running), for tests
    that drive the servicer or the stores directly."""
    migrate(database_url)
    settings = upload_settings(database_url, tmp_path, locks_address)
    built = build_components(settings, runtime_options, SyncSettings(webhook_port=0))
    yield built
    await built.close()


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    """Per-module setting overrides (a module redefines this fixture)."""
    return {}


@pytest.fixture
def blob_backend() -> str:
    """Where the service keeps blobs: "local"; a test parametrizes ["local", "s3"]."""
    return "local"


@pytest.fixture
def sync_settings() -> SyncSettings:
    """Sync engine settings: webhook endpoint on any free port (a module may override)."""
    return SyncSettings(webhook_port=0)


@pytest.fixture
async def cluster(
    database_url: str,
    tmp_path: Path,
    locks_address: str,
    runtime_options: RuntimeOptions,
    settings_overrides: dict[str, Any],
    sync_settings: SyncSettings,
    blob_backend: str,
    request: pytest.FixtureRequest,
) -> AsyncIterator[UploadCluster]:
    """The upload service in-process on a fresh database (SQLite and PostgreSQL)."""
    overrides = dict(settings_overrides)
    if blob_backend == "s3":
        overrides = {**request.getfixturevalue("s3").upload_settings(), **overrides}
    settings = upload_settings(database_url, tmp_path, locks_address, **overrides)
    app = build_upload_app(settings, runtime_options, sync_settings)
    async with running_app(app) as service:
        address = f"127.0.0.1:{service.app.bound_port}"
        channel = grpc.aio.insecure_channel(
            address,
            options=[
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ],
        )
        c = UploadCluster(address, settings, channel, open_blob_store(settings))
        for user, token in TOKENS.items():
            c.clients[user] = Client(
                upload_pb2_grpc.UploadServiceStub(channel),
                upload_pb2_grpc.FileServiceStub(channel),
                (("authorization", f"Bearer {token}"),),
            )
        try:
            yield c
        finally:
            await channel.close()
            await c.blobs.close()


@pytest.fixture
async def sessions(cluster: UploadCluster) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    """Sessions on the cluster's database, for tests that read its rows directly."""
    engine = create_engine(cluster.settings.database_url)
    yield session_factory(engine)
    await engine.dispose()
