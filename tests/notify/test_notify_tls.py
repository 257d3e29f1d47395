"""TLS and mTLS on a real notify service: a client certificate's name is a principal, a
certificate from another CA or a plaintext client never gets in, and a renewed server
certificate is served without a restart."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import grpc
import pytest
from notify.harness import event
from serentak.admin.v1 import admin_pb2, admin_pb2_grpc
from serentak.channels import open_channel
from serentak.cli import main as serentak_cli
from serentak.credentials import ClientSecurity, ClientTls, user_client_security
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from support.grpc_errors import error_info
from support.pki import CertFiles, Pki, server_tls_settings

from services.common.admin.cli import main as admin_cli

PRINCIPALS = {
    "upload.serentak.test": "upload",
    "ops-robot": "ops",
    "spiffe://serentak.test/ns/prod/sa/upload": "upload",
}


def _tls(pki: Pki, client: CertFiles | None) -> ClientSecurity:
    return ClientSecurity(
        tls=ClientTls(pki.ca, client.cert if client else None, client.key if client else None)
    )


def _stubs(address: str, security: ClientSecurity):  # type: ignore[no-untyped-def]
    channel = open_channel(address, security)
    return channel, notify_pb2_grpc.NotifyServiceStub(channel)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")


async def test_client_certificate_names_map_to_principals(notify_factory, pki: Pki) -> None:  # type: ignore[no-untyped-def]
    settings = {
        **server_tls_settings(pki, pki.server(), mtls=True),
        "auth_mtls_principals": PRINCIPALS,
    }
    async with notify_factory(**settings) as notify:
        address = f"127.0.0.1:{notify.service.app.bound_port}"
        upload_cert = pki.issue("upload", "upload.serentak.test")
        ops_cert = pki.issue("ops", "ops.serentak.test", common_name="ops-robot")
        laptop = pki.issue("laptop", "alice-laptop.serentak.test")
        request = notify_pb2.IngestRequest(event=event(f"f-{uuid.uuid4().hex[:8]}", 1))

        channel, stub = _stubs(address, _tls(pki, upload_cert))
        async with channel:
            # No token at all: the certificate (SAN DNS) is the upload principal.
            assert not (await stub.Ingest(request)).duplicate
        # A SPIFFE id (SAN URI), as a service mesh issues them.
        spiffe = pki.issue_uri("spiffe-upload", "spiffe://serentak.test/ns/prod/sa/upload")
        channel, stub = _stubs(address, _tls(pki, spiffe))
        async with channel:
            again = notify_pb2.IngestRequest(event=event(f"f-{uuid.uuid4().hex[:8]}", 1))
            assert not (await stub.Ingest(again)).duplicate
        channel, stub = _stubs(address, _tls(pki, ops_cert))
        async with channel:
            # Mapped by its CN: ops may read the queue, but may not Ingest.
            await admin_pb2_grpc.AdminServiceStub(channel).QueueStats(admin_pb2.QueueStatsRequest())
            with pytest.raises(grpc.aio.AioRpcError) as wrong:
                await stub.Ingest(request)
            assert wrong.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert error_info(wrong.value).reason == "PRINCIPAL_NOT_ALLOWED"
        channel, stub = _stubs(address, _tls(pki, laptop))
        async with channel:
            # A valid certificate naming no principal proves nothing by itself...
            with pytest.raises(grpc.aio.AioRpcError) as anonymous:
                await stub.Ingest(request)
            assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert error_info(anonymous.value).reason == "MISSING_CREDENTIALS"
            # ...and a user still authenticates with a token over it.
            md = (("authorization", "Bearer dev-alice"),)
            await stub.GetUnreadCount(notify_pb2.GetUnreadCountRequest(), metadata=md)
        # The admin CLI over mTLS, authenticated by the ops certificate alone.
        tls_flags = ["--ca", str(pki.ca), "--cert", str(ops_cert.cert), "--key", str(ops_cert.key)]
        as_ops = ["--address", address, "--token", "not-a-token", *tls_flags, "stats"]
        assert await asyncio.to_thread(admin_cli, as_ops) == 2  # a bad token is not ignored
        as_cert = ["--address", address, *tls_flags, "stats"]
        assert await asyncio.to_thread(admin_cli, as_cert) == 0


async def test_strangers_and_plaintext_never_get_in(
    notify_factory, pki: Pki, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    settings = {
        **server_tls_settings(pki, pki.server(), mtls=True),
        "auth_mtls_principals": PRINCIPALS,
    }
    async with notify_factory(**settings) as notify:
        address = f"127.0.0.1:{notify.service.app.bound_port}"
        md = (("authorization", "Bearer dev-alice"),)
        other = Pki(tmp_path / "other", name="other")
        # A certificate with a mapped name, but from another CA: refused at the handshake.
        forged = other.issue("upload", "upload.serentak.test")
        no_cert = None
        for security in (_tls(pki, forged), _tls(pki, no_cert), ClientSecurity()):
            channel, stub = _stubs(address, security)
            async with channel:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.GetUnreadCount(
                        notify_pb2.GetUnreadCountRequest(), metadata=md, timeout=10
                    )
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        # The CLI dialling a TLS server in plaintext says what to do.
        argv = ["--address", address, "--token", "dev-alice", "ls"]
        assert await asyncio.to_thread(serentak_cli, argv) == 6  # unavailable


def test_cli_explains_an_unavailable_tls_server(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Nothing listens here: the same UNAVAILABLE a plaintext dial to a TLS server gets.
    from support.ports import free_port

    assert serentak_cli(["--address", f"127.0.0.1:{free_port()}", "ls"]) == 6  # unavailable
    err = capsys.readouterr().err
    assert "UNAVAILABLE" in err and "--ca" in err


async def test_a_renewed_certificate_is_served_without_restart(
    notify_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    old_ca = Pki(tmp_path / "old", name="old")
    new_ca = Pki(tmp_path / "new", name="new")
    served = old_ca.server()
    async with notify_factory(**server_tls_settings(old_ca, served, mtls=False)) as notify:
        address = f"127.0.0.1:{notify.service.app.bound_port}"
        md = (("authorization", "Bearer dev-alice"),)

        async def unread(ca: Pki) -> int:
            channel, stub = _stubs(address, _tls(ca, None))
            async with channel:
                resp = await stub.GetUnreadCount(
                    notify_pb2.GetUnreadCountRequest(), metadata=md, timeout=10
                )
                return resp.unread_count

        assert await unread(old_ca) == 0
        with pytest.raises(grpc.aio.AioRpcError):
            await unread(new_ca)
        # Renewal: new files in place (what cert-manager does), atomically.
        renewed = new_ca.server("renewed")
        os.replace(renewed.key, served.key)
        os.replace(renewed.cert, served.cert)
        assert await unread(new_ca) == 0  # the next handshake serves the new certificate
        with pytest.raises(grpc.aio.AioRpcError):
            await unread(old_ca)


def test_user_client_security_needs_cert_and_key_together() -> None:
    from serentak.errors import ConfigError

    with pytest.raises(ConfigError):
        user_client_security("t", cert_file="c.pem")
