"""TLS to replicated services by the README's list-of-IPs address form
(`127.0.0.1:A,127.0.0.1:B`): two replicas of locks (mTLS) and two of notify (TLS), each
with its own certificate naming only itself and the shared service name
(`locks.serentak.internal`). Upload's merge (upload -> locks) and relay (upload -> notify),
the SDK and the CLI reach whichever replica is up, given the name to verify; without it,
the list is refused with a ConfigError that names the setting, where gRPC alone would fail
every handshake."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from serentak.cli import main as serentak_cli
from serentak.errors import ConfigError
from serentak.sdk import SerentakClient, notifications_in
from support.pki import CertFiles, Pki, client_tls_settings, server_tls_settings
from support.ports import free_port
from support.postgres import PostgresDatabases

from services.common.admin.cli import main as admin_cli
from services.common.grpc_server import RunningService, ServiceApp, start
from services.common.jobs import RuntimeOptions
from services.locks.app import build_app as build_locks_app
from services.locks.settings import LocksSettings
from services.notify.app import build_app as build_notify_app
from services.notify.settings import NotifySettings
from services.upload.app import build_app as build_upload_app
from services.upload.settings import UploadSettings
from services.upload.sync.settings import SyncSettings

DEADLINE_S = 60.0
LOCKS_NAME = "locks.serentak.internal"
NOTIFY_NAME = "notify.serentak.internal"
UPLOAD_NAME = "upload.serentak.internal"


@dataclass
class Replica:
    """One replica on a fixed port, restartable there (a new server, same settings)."""

    build: Callable[[], ServiceApp]
    port: int
    running: RunningService | None = None

    async def start(self) -> None:
        self.running = await start(replace(self.build(), port=self.port, metrics_port=0))

    async def stop(self) -> None:
        if self.running is not None:
            await self.running.stop()
            self.running = None


def _list(replicas: list[Replica]) -> str:
    return ",".join(f"127.0.0.1:{r.port}" for r in replicas)


@contextlib.asynccontextmanager
async def _replicas(builds: list[Callable[[], ServiceApp]]) -> AsyncIterator[list[Replica]]:
    replicas = [Replica(build, free_port()) for build in builds]
    try:
        for replica in replicas:
            await replica.start()
        yield replicas
    finally:
        for replica in replicas:
            await replica.stop()


@dataclass
class Deployment:
    """Two locks and two notify replicas behind list addresses, and how to reach them."""

    pki: Pki
    locks: list[Replica]
    notify: list[Replica]
    upload_settings: dict[str, object]
    alice_cert: CertFiles

    def client(self, token: str, upload_address: str, **names: str) -> SerentakClient:
        """An SDK client over TLS presenting alice's device certificate (locks wants one)."""
        return SerentakClient(
            upload_address,
            token=token,
            ca_file=str(self.pki.ca),
            cert_file=str(self.alice_cert.cert),
            key_file=str(self.alice_cert.key),
            locks_address=_list(self.locks),
            notify_address=_list(self.notify),
            **names,
        )


async def _round(deployment: Deployment, tmp_path: Path, file_id: str, label: str) -> str:
    """A fresh upload replica and SDK clients do every cross-service call once: a new
    version (merge under the file lock via locks, relayed to notify), a lock held by the
    SDK, and bob hearing of the version on his stream. Returns the file id."""
    upload = build_upload_app(
        UploadSettings(**deployment.upload_settings),  # type: ignore[arg-type]
        RuntimeOptions(node_id=f"tls-{label}-{uuid.uuid4().hex[:6]}", poll_interval=0.05),
        SyncSettings(webhook_port=0, client_state=f"state-{uuid.uuid4().hex}"),
    )
    up = await start(replace(upload, port=0, metrics_port=0))
    names = {"locks_tls_server_name": LOCKS_NAME, "notify_tls_server_name": NOTIFY_NAME}
    address = f"127.0.0.1:{up.app.bound_port}"
    try:
        async with (
            deployment.client("dev-alice", address, tls_server_name=UPLOAD_NAME, **names) as alice,
            deployment.client("dev-bob", address, tls_server_name=UPLOAD_NAME, **names) as bob,
        ):
            path = tmp_path / f"{label}.bin"
            path.write_bytes(os.urandom(10_000))
            # Chunked: a merge, committed under lock file:{id} held through locks.
            done = await alice.upload(path, chunk_size=4096, to_file_id=file_id)
            if not file_id:
                await alice.share(done.file_id, "bob", "editor")
            async with alice.hold(f"user:alice:{label}", ttl_seconds=10) as held:
                assert held.token > 0

            async def heard() -> None:
                # A new file: bob hears of the share; a new version: of the content update.
                async for message in bob.subscribe("0", device_id=f"phone-{label}"):
                    for n in notifications_in(message):
                        if n.file_id == done.file_id and (
                            not file_id
                            or (
                                n.event_type == "file.content.updated"
                                and n.version == done.file_version
                            )
                        ):
                            return

            await asyncio.wait_for(heard(), DEADLINE_S)
            return done.file_id
    finally:
        await up.stop()


@pytest.fixture
async def deployment(
    tmp_path: Path, etcd, postgres: PostgresDatabases, database_url: str
) -> AsyncIterator[Deployment]:  # type: ignore[no-untyped-def]
    pki = Pki(tmp_path / "pki")
    prefix = f"/tls-{uuid.uuid4().hex}/"
    notify_url = postgres.create()
    # Each replica's certificate names itself and the service, never 127.0.0.1: only the
    # shared name can verify a list of addresses.
    locks_certs = [
        pki.issue(f"locks-{n}", f"locks-{n}.serentak.internal", LOCKS_NAME) for n in (1, 2)
    ]
    notify_certs = [
        pki.issue(f"notify-{n}", f"notify-{n}.serentak.internal", NOTIFY_NAME) for n in (1, 2)
    ]
    upload_cert = pki.issue("upload", UPLOAD_NAME)
    principals = {UPLOAD_NAME: "upload"}

    def locks(cert: CertFiles) -> Callable[[], ServiceApp]:
        return lambda: build_locks_app(
            LocksSettings(
                etcd_endpoint=etcd.endpoint,
                lock_prefix=prefix,
                auth_mtls_principals=principals,
                **server_tls_settings(pki, cert, mtls=True),  # type: ignore[arg-type]
            )
        )

    def notify(cert: CertFiles, n: int) -> Callable[[], ServiceApp]:
        return lambda: build_notify_app(
            NotifySettings(
                notify_database_url=notify_url,
                data_dir=tmp_path / f"notify-{n}",
                worker_poll_seconds=0.05,
                auth_mtls_principals=principals,
                **server_tls_settings(pki, cert, mtls=False),  # type: ignore[arg-type]
            )
        )

    async with (
        _replicas([locks(c) for c in locks_certs]) as lock_replicas,
        _replicas([notify(c, n) for n, c in enumerate(notify_certs)]) as notify_replicas,
    ):
        yield Deployment(
            pki=pki,
            locks=lock_replicas,
            notify=notify_replicas,
            upload_settings={
                "upload_database_url": database_url,
                "data_dir": tmp_path / "upload",
                "locks_address": _list(lock_replicas),
                "notify_address": _list(notify_replicas),
                "locks_tls_server_name": LOCKS_NAME,
                "notify_tls_server_name": NOTIFY_NAME,
                "min_chunk_size": 1024,
                "publish_events": True,
                **server_tls_settings(pki, upload_cert, mtls=False),
                # upload presents its certificate to locks (mTLS) and notify.
                **client_tls_settings(pki, upload_cert),
            },
            alice_cert=pki.issue("alice-phone", "alice-phone.serentak.test"),
        )


async def test_every_replica_is_reached_by_the_shared_name(
    deployment: Deployment, tmp_path: Path
) -> None:
    first, second = (
        (deployment.locks[0], deployment.notify[0]),
        (
            deployment.locks[1],
            deployment.notify[1],
        ),
    )
    file_id = await _round(deployment, tmp_path, "", "both")
    # Only the second replicas up: every call reaches them.
    for replica in first:
        await replica.stop()
    await _round(deployment, tmp_path, file_id, "second")
    # Only the first ones (restarted at their addresses): every call reaches them.
    for replica in first:
        await replica.start()
    for replica in second:
        await replica.stop()
    await _round(deployment, tmp_path, file_id, "first")


async def test_without_the_name_a_list_is_refused_with_the_setting_named(
    deployment: Deployment, tmp_path: Path
) -> None:
    # The service refuses to start, naming the variable to set.
    for missing in ("locks_tls_server_name", "notify_tls_server_name"):
        settings = {k: v for k, v in deployment.upload_settings.items() if k != missing}
        with pytest.raises(ConfigError, match=f"SERENTAK_{missing.upper()}"):
            build_upload_app(UploadSettings(**settings))  # type: ignore[arg-type]
    # The SDK: refused when the channel is made, before any handshake.
    async with deployment.client("dev-alice", "127.0.0.1:1") as alice:
        with pytest.raises(ConfigError, match="TLS server name"):
            alice.hold("user:alice:nameless")
    # A name without TLS is a mistake too, said at once.
    with pytest.raises(ConfigError, match="without TLS"):
        SerentakClient("127.0.0.1:1", token="dev-alice", locks_tls_server_name=LOCKS_NAME)
    # What gRPC alone does with the list: the list is checked as a host name, and fails.
    credentials = grpc.ssl_channel_credentials(root_certificates=deployment.pki.ca.read_bytes())
    target = f"ipv4:{_list(deployment.notify)}"
    async with grpc.aio.secure_channel(target, credentials) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_cli_reaches_a_replica_list_by_the_name_from_its_settings(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERENTAK_NOTIFY_ADDRESS", _list(deployment.notify))
    monkeypatch.setenv("SERENTAK_AUTH_MODE", "dev")  # the dev ops token
    argv = ["--ca", str(deployment.pki.ca), "admin", "--service", "notify", "stats"]
    assert await asyncio.to_thread(serentak_cli, argv) == 2  # usage: the name is missing
    monkeypatch.setenv("SERENTAK_NOTIFY_TLS_SERVER_NAME", NOTIFY_NAME)
    assert await asyncio.to_thread(serentak_cli, argv) == 0
    # The operators' admin tool (python -m services.common.admin) takes the name as a flag.
    ops = ["--address", _list(deployment.notify), "--ca", str(deployment.pki.ca), "stats"]
    assert await asyncio.to_thread(admin_cli, ops) == 2  # refused: no name to verify
    named = ["--tls-server-name", NOTIFY_NAME, *ops]
    assert await asyncio.to_thread(admin_cli, named) == 0
    await deployment.notify[0].stop()
    assert await asyncio.to_thread(serentak_cli, argv) == 0
    assert await asyncio.to_thread(admin_cli, named) == 0
