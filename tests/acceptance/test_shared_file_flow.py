"""The whole flow of DESIGN.md, across real services: a new version of a shared file is
uploaded in chunks, merged once, committed under the file lock, published through the outbox
relay to notify's Ingest, and announced to each collaborator exactly once (the actor never)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from pathlib import Path

import pytest
from serentak.channels import open_channel
from serentak.credentials import ClientSecurity, ClientTls
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from support.jwks import JwksServer, SigningKey, claims, jwt_settings
from support.pki import Pki, client_tls_settings, server_tls_settings
from support.services import running_app
from upload.upload_helpers import chunk_request, create_request, split, wait_status

from services.common.jobs import RuntimeOptions
from services.locks.app import build_app as build_locks_app
from services.locks.settings import LocksSettings
from services.notify.app import build_app as build_notify_app
from services.notify.settings import NotifySettings
from services.upload.app import build_app as build_upload_app
from services.upload.settings import UploadSettings
from services.upload.sync.settings import SyncSettings

DEADLINE_S = 60.0


# jwt transport: the dev token names below stand for these JWTs (filled per test).
_TOKENS: dict[str, str] = {}


def _md(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {_TOKENS.get(token, token)}"),)


async def _upload(stub, data: bytes, **target) -> upload_pb2.Upload:
    chunk = 4096
    request = (
        create_request(data, chunk, **target)
        if "file_id" not in target
        else (
            upload_pb2.CreateUploadRequest(
                file_id=target["file_id"],
                total_chunks=len(split(data, chunk)),
                total_size=len(data),
                chunk_size=chunk,
            )
        )
    )
    upload = await stub.CreateUpload(request, metadata=_md("dev-alice"))
    pieces = split(data, chunk)
    for index in reversed(range(len(pieces))):  # out of order on purpose
        await stub.PutChunk(
            chunk_request(upload.upload_id, index, pieces[index]), metadata=_md("dev-alice")
        )
    return upload


def _transport(
    kind: str, tmp_path: Path, stack: contextlib.ExitStack, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict, dict, dict, ClientSecurity]:
    """Settings overrides (locks, notify, upload) and the test client's channel security.

    mtls: every hop is TLS with certificates made now; locks and notify require a client
    certificate (upload presents its own), upload serves users over TLS. jwt: the same,
    and every service in jwt mode against a JWKS on loopback; users carry JWTs, and the
    upload service calls locks and notify with its client-credentials token from a file.
    """
    if kind == "plaintext":
        return {}, {}, {}, ClientSecurity()
    if kind == "jwt":
        internal, notify, upload, client = _transport("mtls", tmp_path, stack, monkeypatch)
        key = SigningKey()
        idp = stack.enter_context(contextlib.closing(JwksServer(key)))
        jwt_mode = jwt_settings(idp)
        for user in ("alice", "bob", "carol"):
            monkeypatch.setitem(_TOKENS, f"dev-{user}", key.sign(claims(sub=user)))
        token_file = tmp_path / "upload.jwt"
        token_file.write_text(key.sign(claims(sub="upload", client_id="serentak-upload")))
        return (
            {**internal, **jwt_mode},
            {**notify, **jwt_mode},
            {**upload, **jwt_mode, "client_token_file": token_file},
            client,
        )
    pki = Pki(tmp_path / "pki")
    server = pki.server()
    internal = {
        **server_tls_settings(pki, server, mtls=True),
        "auth_mtls_principals": {"upload.serentak.test": "upload"},
    }
    upload = {
        **server_tls_settings(pki, server, mtls=False),
        **client_tls_settings(pki, pki.issue("upload", "upload.serentak.test")),
    }
    device = pki.issue("device", "bob-phone.serentak.test")
    return internal, internal, upload, ClientSecurity(ClientTls(pki.ca, device.cert, device.key))


@pytest.mark.parametrize("transport", ["plaintext", "mtls", "jwt"])
async def test_new_version_of_shared_file_notifies_each_collaborator_once(
    database_url: str, tmp_path: Path, etcd, request, transport: str, monkeypatch
) -> None:
    stack = contextlib.ExitStack()
    request.addfinalizer(stack.close)
    locks_tls, notify_tls, upload_tls, client = _transport(transport, tmp_path, stack, monkeypatch)
    if database_url.startswith("sqlite"):
        notify_url = f"sqlite+aiosqlite:///{tmp_path / 'notify.db'}"
    else:
        notify_url = request.getfixturevalue("postgres").create()
    options = RuntimeOptions(node_id=f"e2e-{uuid.uuid4().hex[:6]}", poll_interval=0.05)
    locks = build_locks_app(
        LocksSettings(
            etcd_endpoint=etcd.endpoint, lock_prefix=f"/e2e-{uuid.uuid4().hex}/", **locks_tls
        )
    )
    notify = build_notify_app(
        NotifySettings(
            notify_database_url=notify_url,
            data_dir=tmp_path / "notify",
            worker_poll_seconds=0.05,
            **notify_tls,
        )
    )
    async with running_app(locks) as lk, running_app(notify) as nt:
        upload = build_upload_app(
            UploadSettings(
                upload_database_url=database_url,
                data_dir=tmp_path / "upload",
                locks_address=f"127.0.0.1:{lk.app.bound_port}",
                notify_address=f"127.0.0.1:{nt.app.bound_port}",
                min_chunk_size=1024,
                publish_events=True,
                **upload_tls,
            ),
            options,
            SyncSettings(webhook_port=0, client_state=f"state-{uuid.uuid4().hex}"),
        )
        async with (
            running_app(upload) as up,
            open_channel(f"127.0.0.1:{up.app.bound_port}", client) as uch,
            open_channel(f"127.0.0.1:{nt.app.bound_port}", client) as nch,
        ):
            uploads = upload_pb2_grpc.UploadServiceStub(uch)
            files = upload_pb2_grpc.FileServiceStub(uch)
            notes = notify_pb2_grpc.NotifyServiceStub(nch)
            bob_stream = notes.Subscribe(
                notify_pb2.SubscribeRequest(device_id="bob-phone"), metadata=_md("dev-bob")
            )
            first = await bob_stream.read()  # the stream's position marker: it is live now
            assert not first.notification.notification_id

            v1 = os.urandom(10_000)
            created = await _upload(uploads, v1, name="report.bin")
            done = await wait_status_by(uploads, created.upload_id)
            file_id = done.file_id
            shared = await files.ShareFile(
                upload_pb2.ShareFileRequest(
                    file_id=file_id, user_id="bob", role=upload_pb2.ROLE_EDITOR
                ),
                metadata=_md("dev-alice"),
            )
            await files.ShareFile(
                upload_pb2.ShareFileRequest(
                    file_id=file_id, user_id="carol", role=upload_pb2.ROLE_VIEWER
                ),
                metadata=_md("dev-alice"),
            )
            v2 = os.urandom(9_000)
            second = await _upload(uploads, v2, file_id=file_id)
            finished = await wait_status_by(uploads, second.upload_id)
            assert finished.file_version > shared.version

            # Bob's live stream shows the new content version (delivered via outbox -> Ingest).
            async def next_content_update() -> notify_pb2.Notification:
                while True:
                    msg = await bob_stream.read()
                    n = msg.notification
                    if (
                        n.event_type == "file.content.updated"
                        and n.version == finished.file_version
                    ):
                        return n

            seen = await asyncio.wait_for(next_content_update(), DEADLINE_S)
            assert seen.file_id == file_id and seen.actor_user_id == "alice"
            bob_stream.cancel()

            async def notifications(token: str) -> list[notify_pb2.Notification]:
                reply = await notes.ListNotifications(
                    notify_pb2.ListNotificationsRequest(page_size=100), metadata=_md(token)
                )
                return list(reply.notifications)

            # Carol was shared after v1 and before v2: she hears of v2 exactly once too.
            deadline = asyncio.get_running_loop().time() + DEADLINE_S
            while True:
                carol = await notifications("dev-carol")
                if any(n.version == finished.file_version for n in carol):
                    break
                assert asyncio.get_running_loop().time() < deadline, carol
                await asyncio.sleep(0.05)
            bob = await notifications("dev-bob")
            for mine in (bob, carol):
                keys = [(n.file_id, n.version) for n in mine]
                assert len(keys) == len(set(keys)), "one notification per (user, file, version)"
                assert [
                    n
                    for n in mine
                    if n.event_type == "file.content.updated" and n.version == finished.file_version
                ]
            # v1 was committed before anyone else could see the file: nobody is told of it.
            assert all(n.version != done.file_version for n in bob + carol)
            # The actor is never notified of her own changes.
            assert await notifications("dev-alice") == []
            unread = await notes.GetUnreadCount(
                notify_pb2.GetUnreadCountRequest(), metadata=_md("dev-bob")
            )
            assert unread.unread_count == len(bob)


async def wait_status_by(stub, upload_id: str) -> upload_pb2.Upload:
    class _Client:
        uploads = stub
        metadata = _md("dev-alice")

    upload = await wait_status(
        _Client, upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED, upload_pb2.UPLOAD_STATUS_FAILED
    )
    assert upload.status == upload_pb2.UPLOAD_STATUS_COMPLETED, upload.failure_reason
    return upload
