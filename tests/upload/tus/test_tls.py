"""With the service's TLS certificate configured, the tus endpoint serves HTTPS on it (and
nothing in the clear): tuspy uploads through it trusting only the deployment's CA, and a
renewed certificate reaches new connections without a restart."""

from __future__ import annotations

import asyncio
import io
import os
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from support.pki import Pki
from support.services import running_app
from tusclient import client as tus_client
from upload.conftest import Client, upload_settings
from upload.upload_helpers import sha256, wait_status

from services.upload.app import assemble
from services.upload.components import UploadComponents
from services.upload.sync.settings import SyncSettings

ALICE = (("authorization", "Bearer dev-alice"),)


@dataclass
class Served:
    url: str
    port: int
    grpc_port: int
    parts: UploadComponents
    ca: Path
    pki_folder: Path


@pytest.fixture
async def served(
    database_url: str, tmp_path: Path, locks_address: str, runtime_options
) -> AsyncIterator[Served]:
    pki = Pki(tmp_path / "pki")
    leaf = pki.issue("upload", "127.0.0.1", "localhost")
    settings = upload_settings(
        database_url,
        tmp_path,
        locks_address,
        tus_enabled=True,
        tus_port=0,
        tls_cert_file=leaf.cert,
        tls_key_file=leaf.key,
        # The sweep is when renewed files are picked up: often, for the renewal test.
        expiry_interval_seconds=0.2,
    )
    app, parts = assemble(settings, runtime_options, SyncSettings(webhook_port=0))
    assert parts.tus is not None
    async with running_app(app) as service:
        await asyncio.wait_for(parts.tus.started.wait(), 30)
        yield Served(
            parts.tus.url,
            parts.tus.port,
            service.app.bound_port,
            parts,
            pki.ca,
            pki.folder,
        )


def _trusting(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


async def test_tuspy_uploads_over_https_trusting_only_the_deployments_ca(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert served.url.startswith("https://")
    # tuspy verifies certificates with requests: the CA bundle is the deployment's alone.
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(served.ca))
    data = os.urandom(300_000)
    uploader = tus_client.TusClient(
        served.url, headers={"Authorization": "Bearer dev-alice"}
    ).uploader(file_stream=io.BytesIO(data), metadata={"filename": "secure.bin"})
    await asyncio.to_thread(uploader.upload)
    assert uploader.offset == len(data)

    async with httpx.AsyncClient(verify=_trusting(served.ca)) as http:
        head = await http.head(
            uploader.url, headers={"Tus-Resumable": "1.0.0", "Authorization": "Bearer dev-alice"}
        )
    credentials = grpc.ssl_channel_credentials(root_certificates=served.ca.read_bytes())
    async with grpc.aio.secure_channel(f"127.0.0.1:{served.grpc_port}", credentials) as channel:
        alice = Client(
            upload_pb2_grpc.UploadServiceStub(channel),
            upload_pb2_grpc.FileServiceStub(channel),
            ALICE,
        )
        done = await wait_status(
            alice, head.headers["Serentak-Upload-Id"], upload_pb2.UPLOAD_STATUS_COMPLETED
        )
        assert (done.total_size, done.final_checksum) == (len(data), sha256(data))


async def test_nothing_is_served_in_the_clear(served: Served) -> None:
    plain = served.url.replace("https://", "http://")
    async with httpx.AsyncClient() as http:
        with pytest.raises(httpx.HTTPError):
            await http.options(plain)


async def test_a_renewed_certificate_reaches_new_connections(served: Served) -> None:
    async with httpx.AsyncClient(verify=_trusting(served.ca)) as http:
        assert (await http.options(served.url)).status_code == 204
    # Renewed by a new authority (as a rotation would be), files replaced in place.
    renewed = Pki(served.pki_folder / "renewed", "renewed")
    leaf = renewed.issue("upload", "127.0.0.1", "localhost")
    settings = served.parts.settings
    os.replace(leaf.key, settings.tls_key_file)
    os.replace(leaf.cert, settings.tls_cert_file)
    deadline = time.monotonic() + 10
    while True:
        # A new connection each time: served with the renewed certificate once picked up.
        async with httpx.AsyncClient(verify=_trusting(renewed.ca)) as http:
            try:
                answer = await http.options(served.url)
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline, "the renewed certificate was never served"
        await asyncio.sleep(0.1)  # the poll's pace; the loop waits for the outcome
    assert answer.status_code == 204
