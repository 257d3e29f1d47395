"""No valid token is refused at start (issue #34): the signing keys are fetched before a
replica reports ready, and calls that arrive during a fetch wait for that one fetch
(single-flight) instead of being checked against an empty key set.

The identity provider is the real JWKS-over-HTTP stand-in, held (`hold()`) so that the
first fetch is still under way when the calls arrive, whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from support.jwks import (
    AUDIENCE,
    ISSUER,
    JwksServer,
    SigningKey,
    claims,
    jwt_settings,
    settings_env,
)
from support.services import service_process

from services.common.auth.identity import Identity
from services.common.auth.jwt_tokens import ClaimsMapping, JwksKeys, JwtVerifier
from services.common.errors import Unavailable
from services.common.readiness import READINESS

CALLS = 20
# The default: after a fetch, an unknown kid may not trigger another for 5 s, which is what
# turned "a fetch is under way" into "no refresh is due" for the calls that raced it.
MIN_REFRESH_S = 5.0


@pytest.fixture
def idp() -> Iterator[tuple[JwksServer, SigningKey]]:
    key = SigningKey()
    server = JwksServer(key)
    yield server, key
    server.close()


def _verifier(url: str) -> JwtVerifier:
    keys = JwksKeys(url, min_refresh_seconds=MIN_REFRESH_S, timeout_seconds=30.0)
    return JwtVerifier(
        keys,
        issuer=ISSUER,
        audience=AUDIENCE,
        algorithms=["RS256"],
        leeway_seconds=30.0,
        claims=ClaimsMapping(),
    )


async def test_calls_during_the_first_fetch_wait_for_it(idp) -> None:  # type: ignore[no-untyped-def]
    server, key = idp
    verifier = _verifier(server.url)

    async def call(user: str) -> Identity:
        token = key.sign(claims(sub=user))
        await verifier.refresh_keys(token)  # what the per-call wrapper does
        return verifier.verify(token)

    server.hold()
    first = asyncio.create_task(call("first"))
    assert await asyncio.to_thread(server.requested.wait, 60), "no fetch started"
    rest = [asyncio.create_task(call(f"u{i}")) for i in range(CALLS)]
    # One turn of the loop (a yield, not a wait for time): every task runs to its first
    # suspension. Each must be waiting on the fetch; before the fix each had already
    # failed with UNKNOWN_SIGNING_KEY.
    await asyncio.sleep(0)
    assert [t for t in rest if t.done()] == []
    # The caller that started the fetch goes away (deadline, client gone): the fetch goes on.
    first.cancel()
    server.release()
    identities = await asyncio.gather(*rest)
    assert [i.user_id for i in identities] == [f"u{i}" for i in range(CALLS)]
    assert server.fetches == 1
    assert first.cancelled()


async def test_without_a_provider_the_probe_fails_and_tokens_are_unavailable() -> None:
    # Port 9 (discard) on loopback: nothing listens, the fetch fails at once.
    verifier = _verifier("http://127.0.0.1:9/jwks")
    [probe] = verifier.probes()
    assert probe.name == "jwks"
    with pytest.raises(Unavailable) as err:
        await probe.check()
    assert err.value.reason == "SIGNING_KEYS_UNAVAILABLE"
    # Not UNAUTHENTICATED: the token may be valid, the keys are what is missing (retryable).
    token = SigningKey().sign(claims())
    await verifier.refresh_keys(token)
    with pytest.raises(Unavailable) as refused:
        verifier.verify(token)
    assert refused.value.reason == "SIGNING_KEYS_UNAVAILABLE"


def test_a_replica_refuses_no_valid_token_at_start(idp, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server, key = idp
    env = settings_env(jwt_settings(server, auth_jwks_min_refresh_seconds=MIN_REFRESH_S))
    # The held fetch is the first readiness probe: it must not time out while held.
    env["SERENTAK_READINESS_TIMEOUT_SECONDS"] = "120"
    server.hold()
    with service_process("notify", tmp_path, env) as notify:  # returns once it listens
        with grpc.insecure_channel(notify.address) as channel:
            stub = notify_pb2_grpc.NotifyServiceStub(channel)
            calls = [
                stub.GetUnreadCount.future(
                    notify_pb2.GetUnreadCountRequest(),
                    metadata=(("authorization", f"Bearer {key.sign(claims(sub=f'u{i}'))}"),),
                    timeout=120,
                )
                for i in range(CALLS)
            ]
            assert server.requested.wait(60), "the replica never fetched its keys"
            # Sent after the calls on the same connection: its answer means they arrived.
            readiness = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=READINESS), timeout=120
            )
            before = next(readiness).status
            assert before != health_pb2.HealthCheckResponse.SERVING, "ready without keys"
            server.release()
            refused = []
            for call in calls:
                try:
                    assert call.result().unread_count == 0
                except grpc.RpcError as exc:
                    refused.append((exc.code(), exc.details()))
            assert refused == []
            statuses = (update.status for update in readiness)
            assert health_pb2.HealthCheckResponse.SERVING in statuses
            readiness.cancel()
    assert server.fetches == 1
