"""The capacity gate's pools and stream caps (services/common/call_capacity.py), without a
server: which cap refuses which caller, with which reason and delay, and that every slot
comes back once. The same caps on a running notify server: tests/notify/test_notify_capacity.py."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest
from prometheus_client import REGISTRY

from services.common.auth import Authenticator, Identity
from services.common.call_capacity import (
    REASONS,
    CallCapacity,
    CapacityGate,
    CapacityLimits,
    Slot,
    _PerKey,
)
from services.common.errors import CapacityExhausted

UPLOAD = Identity.for_service("upload")


def user(name: str, tenant: str = "acme") -> Identity:
    return Identity(tenant_id=tenant, user_id=name)


def capacity(**overrides: float) -> CallCapacity:
    sizes: dict = {
        "service_calls": 2,
        "user_calls": 2,
        "streams": 5,
        "streams_per_tenant": 3,
        "streams_per_user": 2,
        "call_retry_seconds": 1.0,
        "stream_retry_seconds": 10.0,
    }
    return CallCapacity(CapacityLimits(**{**sizes, **overrides}))


def in_use(cap: str) -> float:
    return REGISTRY.get_sample_value("serentak_capacity_in_use", {"cap": cap}) or 0.0


def refused(cap: str) -> float:
    return REGISTRY.get_sample_value("serentak_capacity_refused_total", {"cap": cap}) or 0.0


def refusal(gate: CallCapacity, who: Identity | None, *, stream: bool) -> CapacityExhausted:
    with pytest.raises(CapacityExhausted) as exc:
        gate.admit(who, stream=stream)
    return exc.value


def test_service_calls_have_their_own_pool_whatever_users_hold() -> None:
    gate = capacity()
    held = [gate.admit(user(f"u{i}", f"t{i}"), stream=True) for i in range(5)]
    held += [gate.admit(user("alice"), stream=False) for _ in range(2)]
    for stream in (True, False):
        assert refusal(gate, user("zed", "t9"), stream=stream).code == (
            grpc.StatusCode.RESOURCE_EXHAUSTED
        )
    # Every user pool is full; the relay's calls still run, up to their own pool.
    relay = [gate.admit(UPLOAD, stream=False), gate.admit(UPLOAD, stream=True)]
    before = refused("service_calls")
    err = refusal(gate, UPLOAD, stream=False)
    assert (err.reason, err.cap, err.metadata["limit"]) == (
        "CALL_LIMIT_SERVICES",
        "service_calls",
        "2",
    )
    assert refused("service_calls") == before + 1
    relay.pop().release()
    gate.admit(UPLOAD, stream=False)
    for slot in held:
        slot.release()


def test_users_calls_are_bounded_apart_from_their_streams() -> None:
    gate = capacity()
    calls = [gate.admit(user("alice"), stream=False), gate.admit(user("bob"), stream=False)]
    err = refusal(gate, user("carol"), stream=False)
    assert err.reason == "CALL_LIMIT_USERS"
    assert 1.0 <= err.retry_after_seconds <= 1.5
    assert [d.retry_delay.ToNanoseconds() for d in err.status_details()] == [
        int(err.retry_after_seconds * 1e9)
    ]
    gate.admit(user("carol"), stream=True)  # a stream is not a call of that pool
    calls[0].release()
    gate.admit(user("carol"), stream=False)


def test_each_stream_cap_refuses_with_its_own_reason_and_a_retry_delay() -> None:
    gate = capacity()
    alice = [gate.admit(user("alice"), stream=True) for _ in range(2)]
    err = refusal(gate, user("alice"), stream=True)
    assert (err.reason, err.metadata["limit"]) == ("STREAM_LIMIT_USER", "2")
    assert 10.0 <= err.retry_after_seconds <= 15.0
    gate.admit(user("bob"), stream=True)
    assert refusal(gate, user("carol"), stream=True).reason == "STREAM_LIMIT_TENANT"
    gate.admit(user("mallory", "evil"), stream=True)
    gate.admit(user("eve", "evil"), stream=True)
    assert refusal(gate, user("gina", "globex"), stream=True).reason == "STREAM_LIMIT_SERVER"
    # The most precise cap speaks first: alice is at her own cap and acme at its.
    assert refusal(gate, user("alice"), stream=True).reason == "STREAM_LIMIT_USER"
    assert (in_use("streams"), in_use("tenant_streams"), in_use("user_streams")) == (5, 3, 2)
    # A refusal took nothing; a close frees its slot in every cap it counted in.
    alice[0].release()
    assert (in_use("streams"), in_use("tenant_streams"), in_use("user_streams")) == (4, 2, 1)
    gate.admit(user("carol"), stream=True)
    assert gate.open_streams(user("alice")) == 1


def test_a_slot_is_given_back_once() -> None:
    gate = capacity(streams_per_user=1)
    slot = gate.admit(user("alice"), stream=True)
    slot.release()
    slot.release()  # the stream's end and its generator's close both release
    second = gate.admit(user("alice"), stream=True)
    assert refusal(gate, user("alice"), stream=True).reason == "STREAM_LIMIT_USER"
    assert isinstance(second, Slot)
    assert gate.open_streams(user("alice")) == 1


def test_callers_without_credentials_share_one_anonymous_user() -> None:
    gate = capacity(streams_per_user=2)
    gate.admit(None, stream=True)
    gate.admit(None, stream=True)
    assert refusal(gate, None, stream=True).reason == "STREAM_LIMIT_USER"
    gate.admit(user("alice"), stream=True)


def test_every_cap_has_a_reason() -> None:
    assert set(REASONS.values()) == {
        "CALL_LIMIT_SERVICES",
        "CALL_LIMIT_USERS",
        "STREAM_LIMIT_SERVER",
        "STREAM_LIMIT_TENANT",
        "STREAM_LIMIT_USER",
    }


def test_the_peak_per_key_follows_any_order_of_opens_and_closes() -> None:
    rng = random.Random(37)
    per_key = _PerKey()
    held: list[str] = []
    for _ in range(20_000):
        if held and rng.random() < 0.5:
            per_key.remove(held.pop(rng.randrange(len(held))))
        else:
            key = f"k{rng.randrange(30)}"
            per_key.add(key)
            held.append(key)
        assert per_key.peak == max(per_key.counts.values(), default=0)


class _CountingTokens:
    """A token table that counts its verifications."""

    def __init__(self) -> None:
        self.verified = 0

    def verify(self, token: str) -> Identity:
        self.verified += 1
        return user(token)

    async def refresh_keys(self, token: str) -> None:
        return None


class _Call:
    """The part of a call's context the authenticator reads."""

    def __init__(self, token: str) -> None:
        self._md = (("authorization", f"Bearer {token}"),)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._md


async def test_the_gate_and_the_servicer_verify_a_calls_token_once() -> None:
    tokens = _CountingTokens()
    auth = Authenticator(tokens)
    gate = CapacityGate(capacity(), auth)

    async def one_call(token: str) -> Identity:
        # As grpc.aio runs a call: a task of its own, gate first, then the servicer.
        context = _Call(token)
        gate.admit(context, stream=True)  # type: ignore[arg-type]
        return auth.require_user(context)  # type: ignore[arg-type]

    assert (await asyncio.create_task(one_call("alice"))).user_id == "alice"
    assert tokens.verified == 1
    # Another call (context) with the same token is verified again: nothing outlives a call.
    assert (await asyncio.create_task(one_call("alice"))).user_id == "alice"
    assert (await asyncio.create_task(one_call("bob"))).user_id == "bob"
    assert tokens.verified == 3
