"""Fixtures for the tus endpoint: the upload service in-process (real lock service on real
etcd, SQLite and PostgreSQL) with its tus endpoint on a free port, gRPC stubs per user,
and helpers for the file a tus upload makes."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from serentak.events.v1 import events_pb2
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from support.services import running_app
from upload import version_helpers
from upload.conftest import TOKENS, Client, upload_settings
from upload.upload_helpers import download, sha256, wait_status

from services.common.jobs import RuntimeOptions
from services.upload.app import assemble
from services.upload.components import UploadComponents
from services.upload.settings import UploadSettings
from services.upload.sync.settings import SyncSettings

# Small chunks so a few hundred KiB cross several chunk boundaries.
CHUNK = 64 * 1024
ORIGIN = "https://app.example"


@dataclass
class TusWorld:
    """The running service: its tus creation URL, parts, settings and gRPC clients."""

    url: str
    base: str
    port: int
    parts: UploadComponents
    settings: UploadSettings
    clients: dict[str, Client]

    def __getitem__(self, user: str) -> Client:
        return self.clients[user]

    def headers(self, user: str = "alice", **extra: str) -> dict[str, str]:
        """Tus-Resumable and the user's bearer token, plus `extra` (underscores: dashes)."""
        headers = {"Tus-Resumable": "1.0.0", "Authorization": f"Bearer {TOKENS[user]}"}
        headers.update({k.replace("_", "-"): v for k, v in extra.items()})
        return headers

    def http(self) -> httpx.AsyncClient:
        """An HTTP client for the endpoint (relative URLs resolve against its origin)."""
        return httpx.AsyncClient(base_url=self.base, timeout=30)


@pytest.fixture
def tus_overrides() -> dict[str, Any]:
    """Per-module setting overrides (a module redefines this fixture)."""
    return {}


@pytest.fixture
async def tus(
    database_url: str,
    tmp_path: Path,
    locks_address: str,
    runtime_options: RuntimeOptions,
    tus_overrides: dict[str, Any],
    blob_backend: str,
    request: pytest.FixtureRequest,
) -> AsyncIterator[TusWorld]:
    """The upload service with its tus endpoint, on a fresh database (blobs local, or on
    a real S3-compatible server where a test parametrizes `blob_backend` with "s3")."""
    if blob_backend == "s3":
        tus_overrides = {**request.getfixturevalue("s3").upload_settings(), **tus_overrides}
    settings = upload_settings(
        database_url,
        tmp_path,
        locks_address,
        tus_enabled=True,
        tus_port=0,
        tus_chunk_size=CHUNK,
        tus_cors_origins=ORIGIN,
        tus_lock_wait_seconds=30,
        **tus_overrides,
    )
    app, parts = assemble(settings, runtime_options, SyncSettings(webhook_port=0))
    assert parts.tus is not None
    async with running_app(app) as service:
        await asyncio.wait_for(parts.tus.started.wait(), 30)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{service.app.bound_port}")
        clients = {
            user: Client(
                upload_pb2_grpc.UploadServiceStub(channel),
                upload_pb2_grpc.FileServiceStub(channel),
                (("authorization", f"Bearer {token}"),),
            )
            for user, token in TOKENS.items()
        }
        try:
            yield TusWorld(
                parts.tus.url,
                f"http://127.0.0.1:{parts.tus.port}",
                parts.tus.port,
                parts,
                settings,
                clients,
            )
        finally:
            await channel.close()


async def shared_file(world: TusWorld, name: str) -> str:
    """A file of alice's (content by UploadFile, then shared with bob and carol): its id."""
    alice = world["alice"]
    made = await alice.uploads.UploadFile(
        upload_pb2.UploadFileRequest(new_file=upload_pb2.NewFileTarget(name=name), data=b"v1"),
        metadata=alice.metadata,
    )
    for user in ("bob", "carol"):
        await alice.files.ShareFile(
            upload_pb2.ShareFileRequest(
                file_id=made.file.file_id, user_id=user, role=upload_pb2.ROLE_EDITOR
            ),
            metadata=alice.metadata,
        )
    return made.file.file_id


async def content_events(world: TusWorld, file_id: str) -> list[events_pb2.Event]:
    """The file's file.content.updated events in the outbox, in stored order."""
    return await version_helpers.content_events(world.settings.database_url, file_id)


async def assert_one_new_version(
    world: TusWorld, upload_id: str, file_id: str, data: bytes
) -> None:
    """The tus upload merged once into the shared file's next version, with `data`'s
    sha256, and its one content event tells alice, bob and carol."""
    alice = world["alice"]
    done = await wait_status(
        alice, upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED, upload_pb2.UPLOAD_STATUS_FAILED
    )
    assert done.status == upload_pb2.UPLOAD_STATUS_COMPLETED, done.failure_reason
    assert (done.file_id, done.final_checksum) == (file_id, sha256(data))
    file = await alice.files.GetFile(
        upload_pb2.GetFileRequest(file_id=file_id), metadata=alice.metadata
    )
    assert (file.version, file.size, file.checksum) == (done.file_version, len(data), sha256(data))
    got, trailing = await download(alice, file_id)
    assert got == data and trailing["x-checksum"] == sha256(data)
    events = await content_events(world, file_id)
    # UploadFile's version, then this upload's: one event, naming every collaborator.
    assert len(events) == 2 and events[1].version == done.file_version
    assert events[1].file_content_updated.upload_id == upload_id
    assert sorted(events[1].audience_user_ids) == ["alice", "bob", "carol"]


def b64(text: str) -> str:
    """Base64 of UTF-8 `text` (Upload-Metadata values)."""
    return base64.b64encode(text.encode()).decode()


async def create(
    world: TusWorld,
    http: httpx.AsyncClient,
    length: int,
    name: str,
    user: str = "alice",
    content: bytes = b"",
    **extra: str,
) -> httpx.Response:
    """POST a new upload of `length` bytes making file `name` in the user's root."""
    headers = world.headers(
        user, Upload_Length=str(length), Upload_Metadata=f"filename {b64(name)}", **extra
    )
    return await http.post(world.url, headers=headers, content=content)


async def patch(
    world: TusWorld,
    http: httpx.AsyncClient,
    location: str,
    offset: int,
    data: bytes,
    user: str = "alice",
    **extra: str,
) -> httpx.Response:
    """PATCH `data` at `offset`."""
    headers = world.headers(
        user, Upload_Offset=str(offset), Content_Type="application/offset+octet-stream"
    )
    headers.update({k.replace("_", "-"): v for k, v in extra.items()})
    return await http.patch(location, content=data, headers=headers)


async def offset_of(world: TusWorld, http: httpx.AsyncClient, location: str) -> int:
    """The upload's Upload-Offset by HEAD."""
    head = await http.head(location, headers=world.headers())
    assert head.status_code == 200, head.status_code
    return int(head.headers["Upload-Offset"])


async def completed_file(world: TusWorld, upload_id: str) -> tuple[upload_pb2.Upload, bytes]:
    """Wait for the Serentak upload to finish; it and the bytes of the file it made."""
    alice = world["alice"]
    done = await wait_status(
        alice, upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED, upload_pb2.UPLOAD_STATUS_FAILED
    )
    assert done.status == upload_pb2.UPLOAD_STATUS_COMPLETED, done.failure_reason
    data, _ = await download(alice, done.file_id)
    assert done.final_checksum == sha256(data)
    return done, data
