"""A running stack for the client's SDK and CLI tests: locks (etcd), notify and upload,
in-process."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from serentak.sdk import SerentakClient
from support.services import running_app

from services.common.config import DEFAULT_AUTH_TOKENS
from services.common.jobs import RuntimeOptions
from services.locks.app import build_app as build_locks_app
from services.locks.settings import LocksSettings
from services.notify.app import build_app as build_notify_app
from services.notify.settings import NotifySettings
from services.upload.app import build_app as build_upload_app
from services.upload.settings import UploadSettings
from services.upload.sync.settings import SyncSettings

CHUNK = 1024
# Users of acme besides the dev ones, token `tok-<user>`: the audience of a large share.
MANY_USERS = {f"tok-s{i:04d}": {"tenant_id": "acme", "user_id": f"s{i:04d}"} for i in range(1000)}


@dataclass
class Stack:
    """Addresses of the running services and the upload settings (for its blob store)."""

    upload: str
    locks: str
    notify: str
    settings: UploadSettings

    def client(self, token: str) -> SerentakClient:
        """An SDK client calling as the dev user of `token`."""
        return SerentakClient(
            self.upload, token=token, locks_address=self.locks, notify_address=self.notify
        )


@pytest.fixture
async def stack(database_url: str, tmp_path: Path, etcd, request) -> AsyncIterator[Stack]:
    """locks (etcd), notify and upload (publishing events) in-process on `database_url`."""
    if database_url.startswith("sqlite"):
        notify_url = f"sqlite+aiosqlite:///{tmp_path / 'notify.db'}"
    else:
        notify_url = request.getfixturevalue("postgres").create()
    locks = build_locks_app(
        LocksSettings(etcd_endpoint=etcd.endpoint, lock_prefix=f"/sdk-{uuid.uuid4().hex}/")
    )
    notify = build_notify_app(
        NotifySettings(
            notify_database_url=notify_url,
            data_dir=tmp_path / "notify",
            worker_poll_seconds=0.05,
            auth_tokens={**DEFAULT_AUTH_TOKENS, **MANY_USERS},
        )
    )
    async with running_app(locks) as lk, running_app(notify) as nt:
        settings = UploadSettings(
            upload_database_url=database_url,
            data_dir=tmp_path / "upload",
            locks_address=f"127.0.0.1:{lk.app.bound_port}",
            notify_address=f"127.0.0.1:{nt.app.bound_port}",
            min_chunk_size=CHUNK,
            publish_events=True,
        )
        upload = build_upload_app(
            settings,
            RuntimeOptions(node_id=f"sdk-{uuid.uuid4().hex[:6]}", poll_interval=0.05),
            SyncSettings(webhook_port=0, client_state=f"state-{uuid.uuid4().hex}"),
        )
        async with running_app(upload) as up:
            yield Stack(
                f"127.0.0.1:{up.app.bound_port}",
                f"127.0.0.1:{lk.app.bound_port}",
                f"127.0.0.1:{nt.app.bound_port}",
                settings,
            )
