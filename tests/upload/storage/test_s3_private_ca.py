"""An S3 store whose certificate a private CA signed (issue #34, TLS on every hop): with
SERENTAK_S3_CA_FILE the blob store trusts it, for obstore's requests and for the multipart
calls the merge makes itself; without it every request is refused as the certificate's
issuer is unknown, and an unusable CA file stops the service at start.

The store is a real s3s-fs behind a real TLS terminator (support/tls_proxy.py) serving a
certificate of a test CA (support/pki.py) that no system trusts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
from support.pki import Pki
from support.s3 import S3Server
from support.tls_proxy import TlsProxy

import merge_core
from services.common.config import ConfigError
from services.upload.errors import BlobStoreUnavailable
from services.upload.settings import UploadSettings
from services.upload.storage.blob_store import ChunkRef, chunk_key, open_blob_store
from services.upload.storage.blob_store.s3_errors import untrusted_certificate
from services.upload.storage.blob_store.s3_multipart import (
    S3Multipart,
    S3RequestFailed,
    location_of,
)

MIB = 1024 * 1024


def _digest(data: bytes) -> str:
    hasher = merge_core.Hasher("sha256")
    hasher.update(data)
    return hasher.hexdigest()


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """The store's private CA (no relation to the services' own PKI)."""
    return Pki(tmp_path / "pki", "s3-ca")


@pytest.fixture
def proxy(s3: S3Server, pki: Pki) -> Iterator[TlsProxy]:
    """s3s-fs over TLS, its certificate (for 127.0.0.1) signed by `pki`."""
    with TlsProxy("127.0.0.1", s3.port, pki.server("s3")) as running:
        yield running


def _settings(s3: S3Server, proxy: TlsProxy, tmp_path: Path, **overrides: Any) -> UploadSettings:
    values: dict[str, Any] = {
        **s3.upload_settings(),
        "data_dir": tmp_path / "data",
        "s3_endpoint": proxy.endpoint,
        "s3_allow_http": False,
        # The smallest part S3 allows, so the merge below is a multipart upload.
        "s3_part_size": 5 * MIB,
    }
    return UploadSettings(**(values | overrides))


async def test_the_store_trusts_the_private_ca_for_every_call(
    s3: S3Server, proxy: TlsProxy, pki: Pki, tmp_path: Path
) -> None:
    store = open_blob_store(_settings(s3, proxy, tmp_path, s3_ca_file=pki.ca))
    try:
        parts = [os.urandom(4 * MIB + 1), os.urandom(3 * MIB + 7)]
        refs = []
        for i, part in enumerate(parts):
            key = chunk_key("u-ca", i)
            await store.publish(await store.stage(key, part), key)  # obstore's PUT
            refs.append(ChunkRef(i, key, len(part), _digest(part)))
        whole = b"".join(parts)
        # Two parts through the merge's own multipart calls (httpx), read back in ranges.
        merged = await store.merge(refs, "files/f-ca/u-ca", "sha256", _digest(whole))
        assert (merged.size, merged.checksum) == (len(whole), _digest(whole))
        assert await store.read("files/f-ca/u-ca", 5, 10) == whole[5:15]
        assert await store.checksum("files/f-ca/u-ca", "sha256") == _digest(whole)
    finally:
        await store.close()


async def test_without_the_ca_the_certificate_is_refused_and_the_log_says_why(
    s3: S3Server, proxy: TlsProxy, tmp_path: Path
) -> None:
    settings = _settings(s3, proxy, tmp_path)
    store = open_blob_store(settings)
    try:
        with structlog.testing.capture_logs() as logs, pytest.raises(BlobStoreUnavailable):
            await store.publish(await store.stage(chunk_key("u-no-ca", 0), b"x"), "k")
    finally:
        await store.close()
    [failed] = [e for e in logs if e["event"] == "blob_store_error"]
    assert failed["tls"] == (
        "the store's TLS certificate was refused (UnknownIssuer); if a private CA signed it, "
        "set SERENTAK_S3_CA_FILE to that CA"
    )
    # The merge's own multipart calls (OpenSSL, not rustls) refuse it too, as clearly.
    location = location_of(settings, s3.bucket, "t-no-ca")
    assert location is not None
    multipart = S3Multipart(location)
    try:
        with pytest.raises(S3RequestFailed) as refused:
            await multipart.create("k")
    finally:
        await multipart.close()
    hint = untrusted_certificate(refused.value)
    assert hint is not None and "unable to get local issuer certificate" in hint


def test_an_unusable_ca_file_stops_the_store_from_opening(
    s3: S3Server, proxy: TlsProxy, tmp_path: Path
) -> None:
    """Found at start, naming the variable (as every *_FILE setting): missing, not PEM, or
    set for a plain http:// endpoint, where it would protect nothing."""
    missing = tmp_path / "missing.pem"
    message = f"SERENTAK_S3_CA_FILE: cannot read {missing}: No such file or directory"
    with pytest.raises(ConfigError, match=re.escape(message)):
        open_blob_store(_settings(s3, proxy, tmp_path, s3_ca_file=missing))
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    message = f"SERENTAK_S3_CA_FILE: {garbage} holds no PEM certificate"
    with pytest.raises(ConfigError, match=re.escape(message)):
        open_blob_store(_settings(s3, proxy, tmp_path, s3_ca_file=garbage))
    with pytest.raises(ConfigError, match="SERENTAK_S3_ENDPOINT is not https://"):
        open_blob_store(UploadSettings(**s3.upload_settings(), s3_ca_file=garbage))
    # A template's empty `SERENTAK_S3_CA_FILE=`: no private CA, the system's roots.
    assert UploadSettings(s3_ca_file="").s3_ca_file is None
