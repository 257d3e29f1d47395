"""An identity provider whose https certificate a private CA signed (issue #34, TLS on every
hop): with SERENTAK_AUTH_JWKS_CA_FILE a service fetches its keys and accepts a valid token;
without it the fetch is refused (the certificate's issuer is unknown), the `jwks` probe
fails and tokens are answered UNAVAILABLE / SIGNING_KEYS_UNAVAILABLE; an unusable CA file
stops the service at start.

The provider is the real JWKS stand-in (support/jwks.py) over real TLS, its certificate
from a test CA (support/pki.py) that no system trusts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from support.grpc_errors import error_info
from support.jwks import JwksServer, SigningKey, claims, jwt_settings, settings_env
from support.pki import Pki
from support.services import service_process

from services.common.auth import build_authenticator
from services.common.config import CommonSettings, ConfigError
from services.common.readiness import READINESS


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """The identity provider's private CA."""
    return Pki(tmp_path / "pki", "idp-ca")


@pytest.fixture
def idp(pki: Pki) -> Iterator[tuple[JwksServer, SigningKey]]:
    """The JWKS over https (127.0.0.1), its certificate signed by `pki`."""
    key = SigningKey()
    server = JwksServer(key, tls=pki.server("idp"))
    yield server, key
    server.close()


def _unread(address: str, token: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = notify_pb2_grpc.NotifyServiceStub(channel)
        reply = stub.GetUnreadCount(
            notify_pb2.GetUnreadCountRequest(),
            metadata=(("authorization", f"Bearer {token}"),),
            timeout=60,
        )
        return int(reply.unread_count)


def test_with_the_ca_the_keys_are_fetched_and_a_valid_token_accepted(
    idp: tuple[JwksServer, SigningKey], pki: Pki, tmp_path: Path
) -> None:
    server, key = idp
    assert server.url.startswith("https://")
    env = settings_env(jwt_settings(server, auth_jwks_ca_file=str(pki.ca)))
    with service_process("notify", tmp_path, env) as notify:
        assert _unread(notify.address, key.sign(claims())) == 0
    assert server.fetches >= 1


def test_without_the_ca_the_keys_cannot_be_fetched(
    idp: tuple[JwksServer, SigningKey], tmp_path: Path
) -> None:
    server, key = idp
    env = settings_env(jwt_settings(server))
    with service_process("notify", tmp_path, env) as notify:
        with pytest.raises(grpc.RpcError) as refused:
            _unread(notify.address, key.sign(claims()))
        with grpc.insecure_channel(notify.address) as channel:
            ready = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=READINESS), timeout=30
            )
        log = [json.loads(line) for line in notify.log_text().splitlines() if line[:1] == "{"]
    # Retryable and not the token's fault: the keys are what is missing.
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_info(refused.value).reason == "SIGNING_KEYS_UNAVAILABLE"
    assert ready.status != health_pb2.HealthCheckResponse.SERVING
    failures = [entry["error"] for entry in log if entry.get("event") == "jwks_fetch_failed"]
    assert failures and all("CERTIFICATE_VERIFY_FAILED" in error for error in failures)
    assert server.fetches == 0  # no request ever got through the handshake


def test_an_unusable_ca_file_is_refused_at_start(pki: Pki, tmp_path: Path) -> None:
    """Found at start, naming the variable (as every *_FILE setting): missing, not PEM, or
    set for a plain http:// JWKS URL, where it would protect nothing."""
    jwt = {
        "auth_mode": "jwt",
        "auth_jwks_url": "https://127.0.0.1:9/jwks",
        "auth_jwt_issuer": "https://idp.test",
        "auth_jwt_audience": "serentak",
    }
    build_authenticator(CommonSettings(**jwt, auth_jwks_ca_file=pki.ca))  # usable: accepted
    missing = tmp_path / "missing.pem"
    message = f"SERENTAK_AUTH_JWKS_CA_FILE: cannot read {missing}: No such file or directory"
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_authenticator(CommonSettings(**jwt, auth_jwks_ca_file=missing))
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    message = f"SERENTAK_AUTH_JWKS_CA_FILE: {garbage} holds no PEM certificate"
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_authenticator(CommonSettings(**jwt, auth_jwks_ca_file=garbage))
    plain = jwt | {"auth_jwks_url": "http://127.0.0.1:9/jwks"}
    with pytest.raises(ConfigError, match="SERENTAK_AUTH_JWKS_URL is not https://"):
        build_authenticator(CommonSettings(**plain, auth_jwks_ca_file=pki.ca))
    # A template's empty `SERENTAK_AUTH_JWKS_CA_FILE=`: no private CA, the system's roots.
    assert CommonSettings(**jwt, auth_jwks_ca_file="").auth_jwks_ca_file is None
