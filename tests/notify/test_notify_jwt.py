"""jwt mode against a real JWKS endpoint on loopback, through the real notify service.

Every way a bearer token can be wrong answers UNAUTHENTICATED with its own reason; keys
rotate without a restart; Ingest takes only the upload principal and admin RPCs only the
ops role, whoever else presents a valid token.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Iterator

import grpc
import jwt
import pytest
from notify.harness import event
from serentak.admin.v1 import admin_pb2
from serentak.notify.v1 import notify_pb2
from support.grpc_errors import error_info
from support.jwks import JwksServer, SigningKey, claims, jwt_settings

from services.common.admin.cli import main as admin_cli


@pytest.fixture
def idp() -> Iterator[tuple[JwksServer, SigningKey]]:
    key = SigningKey()
    server = JwksServer(key)
    yield server, key
    server.close()


def _md(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def _unread(notify, token: str | None) -> int:  # type: ignore[no-untyped-def]
    md = _md(token) if token is not None else ()
    resp = await notify.stub.GetUnreadCount(notify_pb2.GetUnreadCountRequest(), metadata=md)
    return resp.unread_count


async def _refused(notify, token: str | None) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _unread(notify, token)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, err.value.details()
    return error_info(err.value).reason


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _hs256_with_public_key(key: SigningKey) -> str:
    """The classic confusion attack: HMAC-sign with the (public) RSA key as the secret."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": key.kid}).encode())
    payload = _b64(json.dumps(claims()).encode())
    mac = hmac.new(key.public_pem(), f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64(mac)}"


async def test_each_bad_token_has_its_own_reason(notify_factory, idp) -> None:  # type: ignore[no-untyped-def]
    server, key = idp
    async with notify_factory(**jwt_settings(server)) as notify:
        assert await _unread(notify, key.sign(claims())) == 0
        now = int(time.time())
        cases = {
            "TOKEN_EXPIRED": key.sign(claims(iat=now - 600, nbf=now - 600, exp=now - 120)),
            "TOKEN_NOT_YET_VALID": key.sign(claims(nbf=now + 120)),
            "WRONG_AUDIENCE": key.sign(claims(aud="someone-else")),
            "WRONG_ISSUER": key.sign(claims(iss="https://evil.test")),
            # Same kid, another private key: the signature cannot verify.
            "BAD_SIGNATURE": SigningKey(kid=key.kid).sign(claims()),
            "UNSIGNED_TOKEN": jwt.encode(
                claims(), None, algorithm="none", headers={"kid": key.kid}
            ),
            "ALGORITHM_NOT_ALLOWED": _hs256_with_public_key(key),
            "MISSING_TENANT_CLAIM": key.sign(claims(tenant_id=None)),
            "MISSING_USER_CLAIM": key.sign(claims(sub=None)),
            "MISSING_CLAIM": key.sign(claims(exp=None)),
            "UNKNOWN_SIGNING_KEY": key.sign(claims(), kid="nobody-knows-me"),
            "MALFORMED_TOKEN": "not-a-jwt",
            "MISSING_CREDENTIALS": None,
        }
        reasons = {expected: await _refused(notify, token) for expected, token in cases.items()}
        assert reasons == {expected: expected for expected in cases}
        # Small clock skew is tolerated (leeway 30 s by default).
        assert await _unread(notify, key.sign(claims(nbf=now + 5))) == 0


async def test_key_rotation_without_restart(notify_factory, idp) -> None:  # type: ignore[no-untyped-def]
    server, old = idp
    async with notify_factory(**jwt_settings(server)) as notify:
        assert await _unread(notify, old.sign(claims())) == 0
        new = SigningKey()
        server.publish(new)  # the provider rotates: the old key is gone
        # An unknown kid makes the service fetch the set again: no restart needed.
        assert await _unread(notify, new.sign(claims())) == 0
        assert await _refused(notify, old.sign(claims())) == "UNKNOWN_SIGNING_KEY"


async def test_unknown_kids_cannot_hammer_the_jwks_endpoint(notify_factory, idp) -> None:  # type: ignore[no-untyped-def]
    server, key = idp
    settings = jwt_settings(server, auth_jwks_min_refresh_seconds=3600.0)
    async with notify_factory(**settings) as notify:
        assert await _unread(notify, key.sign(claims())) == 0
        fetched = server.fetches
        for _ in range(10):
            forged = key.sign(claims(), kid=f"random-{uuid.uuid4().hex}")
            assert await _refused(notify, forged) == "UNKNOWN_SIGNING_KEY"
        assert server.fetches == fetched  # no fetch within the minimum refresh interval


async def test_ingest_and_admin_take_only_their_principals(
    notify_factory, idp, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    server, key = idp
    async with notify_factory(**jwt_settings(server)) as notify:
        ev = event(f"f-{uuid.uuid4().hex[:8]}", 1)
        request = notify_pb2.IngestRequest(event=ev)
        as_user = key.sign(claims())
        as_notify = key.sign(claims(client_id="serentak-notify", tenant_id=None))
        as_upload = key.sign(claims(client_id="serentak-upload", sub="svc", tenant_id=None))
        as_ops = key.sign(claims(client_id="serentak-ops", tenant_id=None))
        as_ops_user = key.sign(claims(roles=["ops"]))
        refusals = {}
        for name, token in (("user", as_user), ("notify", as_notify), ("ops", as_ops)):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await notify.stub.Ingest(request, metadata=_md(token))
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            refusals[name] = error_info(err.value).reason
        assert refusals == {
            "user": "SERVICE_REQUIRED",
            "notify": "PRINCIPAL_NOT_ALLOWED",
            "ops": "PRINCIPAL_NOT_ALLOWED",
        }
        accepted = await notify.stub.Ingest(request, metadata=_md(as_upload))
        assert not accepted.duplicate
        # The tenant comes from the token: alice of acme gets the notification, a token
        # for "alice" of another tenant sees nothing of acme's.
        deadline = asyncio.get_running_loop().time() + 60
        while await _unread(notify, as_user) == 0:
            assert asyncio.get_running_loop().time() < deadline, "never delivered"
            await asyncio.sleep(0.05)  # poll interval of the wait above
        assert await _unread(notify, key.sign(claims(tenant_id="evil"))) == 0
        with pytest.raises(grpc.aio.AioRpcError) as anonymous:
            await notify.admin.QueueStats(admin_pb2.QueueStatsRequest())
        assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
        for token in (as_user, as_upload):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await notify.admin.QueueStats(admin_pb2.QueueStatsRequest(), metadata=_md(token))
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert error_info(err.value).reason == "OPS_ROLE_REQUIRED"
        for token in (as_ops, as_ops_user):
            await notify.admin.QueueStats(admin_pb2.QueueStatsRequest(), metadata=_md(token))
        # The admin CLI of an operator in jwt mode: --token is all it needs.
        monkeypatch.setenv("SERENTAK_AUTH_MODE", "jwt")
        address = ["--address", f"127.0.0.1:{notify.service.app.bound_port}"]
        assert await asyncio.to_thread(admin_cli, [*address, "--token", as_ops, "stats"]) == 0
        assert await asyncio.to_thread(admin_cli, [*address, "--token", as_user, "stats"]) == 2
        assert await asyncio.to_thread(admin_cli, [*address, "stats"]) == 2  # no credentials
        # A service principal is not a user: user RPCs refuse it.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _unread(notify, as_upload)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert error_info(err.value).reason == "USER_REQUIRED"


async def test_dev_ingest_takes_only_the_upload_principal(notify) -> None:  # type: ignore[no-untyped-def]
    request = notify_pb2.IngestRequest(event=event(f"f-{uuid.uuid4().hex[:8]}", 1))
    for token, reason in (
        ("dev-alice", "SERVICE_REQUIRED"),
        ("dev-service-locks", "PRINCIPAL_NOT_ALLOWED"),
        ("dev-ops", "PRINCIPAL_NOT_ALLOWED"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await notify.stub.Ingest(request, metadata=_md(token))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert error_info(err.value).reason == reason
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await notify.stub.Ingest(request)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    await notify.stub.Ingest(request, metadata=_md("dev-service-upload"))
