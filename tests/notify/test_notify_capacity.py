"""Issue 37, part 1: user streams never starve service calls. A notify server with small caps
has its streams opened up to every cap (per user, per tenant, the replica's); the refused
stream gets RESOURCE_EXHAUSTED with its cap's reason and a RetryInfo, while the relay's
Ingest and IngestBatch, users' other calls and delivery to the open streams go on. grpc's
own concurrent-call limit (which counted streams and refused the relay) is not in the way.
SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import grpc
import pytest
from notify.harness import SERVICE, NotifyHarness, event, start_notify
from prometheus_client import REGISTRY
from serentak.notify.v1 import notify_pb2
from support.grpc_errors import error_info, retry_delay

from services.common.config import DEFAULT_AUTH_TOKENS
from services.notify.settings import NotifySettings

DEADLINE_S = 30.0
# Users by token: acme's (the dev ones plus dave), evil's mallory and eve, globex's gina.
TOKENS = {
    **DEFAULT_AUTH_TOKENS,
    "tok-dave": {"tenant_id": "acme", "user_id": "dave"},
    "tok-eve": {"tenant_id": "evil", "user_id": "eve"},
    "tok-gina": {"tenant_id": "globex", "user_id": "gina"},
}
CAPS = {
    "streams_per_user_max": 2,
    "streams_per_tenant_max": 3,
    "streams_max": 5,
    "stream_retry_seconds": 4.0,
    # grpc's own limit counted streams: 5 open streams would have refused every call.
    "max_concurrent_rpcs": 2,
}


def md(user: str) -> tuple[tuple[str, str], ...]:
    token = f"dev-{user}" if f"dev-{user}" in TOKENS else f"tok-{user}"
    return (("authorization", f"Bearer {token}"),)


def settings(database_url: str, tmp_path: Path, **overrides: object) -> NotifySettings:
    return NotifySettings(
        notify_database_url=database_url,
        data_dir=tmp_path,
        auth_tokens=TOKENS,
        **{**CAPS, **overrides},  # type: ignore[arg-type]
    )


def sample(name: str, cap: str) -> float:
    return REGISTRY.get_sample_value(name, {"cap": cap}) or 0.0


async def open_stream(notify: NotifyHarness, user: str) -> grpc.aio.UnaryStreamCall:
    """A Subscribe stream of `user`, running in the server (its "now" marker read)."""
    call = notify.stub.Subscribe(notify_pb2.SubscribeRequest(device_id=user), metadata=md(user))
    marker = await asyncio.wait_for(call.read(), DEADLINE_S)
    assert marker is not grpc.aio.EOF and not marker.HasField("notification")
    return call


async def refused_stream(notify: NotifyHarness, user: str) -> grpc.aio.AioRpcError:
    call = notify.stub.Subscribe(notify_pb2.SubscribeRequest(device_id=user), metadata=md(user))
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await asyncio.wait_for(call.read(), DEADLINE_S)
    assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.value
    return exc.value


async def next_file(call: grpc.aio.UnaryStreamCall) -> str:
    item = await asyncio.wait_for(call.read(), DEADLINE_S)
    assert item is not grpc.aio.EOF
    return item.notification.file_id


async def test_streams_up_to_every_cap_leave_service_calls_and_delivery_unaffected(
    database_url: str, tmp_path: Path
) -> None:
    async with start_notify(settings(database_url, tmp_path)) as notify:
        refusals = {
            c: sample("serentak_capacity_refused_total", c)
            for c in ("user_streams", "tenant_streams", "streams")
        }
        alice = [await open_stream(notify, "alice") for _ in range(2)]
        err = await refused_stream(notify, "alice")
        info = error_info(err)
        assert (info.reason, info.metadata["cap"], info.metadata["limit"]) == (
            "STREAM_LIMIT_USER",
            "user_streams",
            "2",
        )
        assert 4.0 <= retry_delay(err) <= 6.0
        bob = await open_stream(notify, "bob")
        err = await refused_stream(notify, "carol")
        assert error_info(err).reason == "STREAM_LIMIT_TENANT"
        assert 4.0 <= retry_delay(err) <= 6.0
        evil = [await open_stream(notify, "mallory"), await open_stream(notify, "eve")]
        err = await refused_stream(notify, "gina")
        assert error_info(err).reason == "STREAM_LIMIT_SERVER"
        assert 4.0 <= retry_delay(err) <= 6.0
        assert sample("serentak_capacity_in_use", "streams") == 5
        assert sample("serentak_capacity_in_use", "tenant_streams") == 3
        assert sample("serentak_capacity_in_use", "user_streams") == 2
        for cap, before in refusals.items():
            assert sample("serentak_capacity_refused_total", cap) == before + 1, cap

        # Every stream cap is full and grpc's old limit (2) is far exceeded: the relay's
        # calls run, and what they commit reaches the streams already open.
        single = f"f-cap-{uuid.uuid4().hex[:8]}"
        resp = await notify.stub.Ingest(
            notify_pb2.IngestRequest(event=event(single, 1, audience=["alice", "bob"])),
            metadata=SERVICE,
        )
        assert resp.outcome == notify_pb2.INGEST_OUTCOME_APPLIED
        batch = [
            event(f"f-capb-{i}-{uuid.uuid4().hex[:6]}", 1, audience=["alice", "bob"])
            for i in range(3)
        ]
        results = await notify.stub.IngestBatch(
            notify_pb2.IngestBatchRequest(events=batch), metadata=SERVICE
        )
        assert [r.outcome for r in results.results] == [notify_pb2.INGEST_OUTCOME_APPLIED] * 3
        wanted = {single, *(e.aggregate_id for e in batch)}
        for call in (*alice, bob):
            assert {await next_file(call) for _ in range(4)} == wanted
        # Users' other calls have a pool of their own, apart from their streams.
        unread = await notify.stub.GetUnreadCount(
            notify_pb2.GetUnreadCountRequest(), metadata=md("carol")
        )
        assert unread.unread_count == 0

        # A closed stream gives its slot back (once the server has seen the cancel).
        alice[0].cancel()
        deadline = time.monotonic() + DEADLINE_S
        while True:
            call = notify.stub.Subscribe(
                notify_pb2.SubscribeRequest(device_id="again"), metadata=md("alice")
            )
            try:
                await asyncio.wait_for(call.read(), DEADLINE_S)
                break
            except grpc.aio.AioRpcError as exc:
                assert error_info(exc).reason == "STREAM_LIMIT_USER"
                assert time.monotonic() < deadline, "the cancelled stream kept its slot"
                await asyncio.sleep(0.01)  # poll interval of the wait above
        for c in (call, alice[1], bob, *evil):
            c.cancel()


async def test_racing_opens_never_pass_a_cap(database_url: str, tmp_path: Path) -> None:
    caps = {"streams_per_user_max": 3, "streams_per_tenant_max": 7, "streams_max": 9}
    users = ["alice", "bob", "carol", "dave", "mallory", "eve"]
    async with start_notify(settings(database_url, tmp_path, **caps)) as notify:
        for _ in range(3):
            owners = [u for u in users for _ in range(8)]
            calls = [
                notify.stub.Subscribe(
                    notify_pb2.SubscribeRequest(device_id=f"{u}-{i}"), metadata=md(u)
                )
                for i, u in enumerate(owners)
            ]
            outcomes = await asyncio.gather(
                *(asyncio.wait_for(c.read(), DEADLINE_S) for c in calls), return_exceptions=True
            )
            opened: dict[str, int] = {}
            reasons: set[str] = set()
            for user, outcome in zip(owners, outcomes, strict=True):
                if isinstance(outcome, grpc.aio.AioRpcError):
                    assert outcome.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    reasons.add(error_info(outcome).reason)
                else:
                    assert isinstance(outcome, notify_pb2.SubscribeResponse), outcome
                    opened[user] = opened.get(user, 0) + 1
            acme = sum(opened.get(u, 0) for u in ("alice", "bob", "carol", "dave"))
            assert max(opened.values()) <= 3 and acme <= 7
            assert sum(opened.values()) == 9, opened  # 48 racing opens fill the replica
            assert reasons <= {"STREAM_LIMIT_USER", "STREAM_LIMIT_TENANT", "STREAM_LIMIT_SERVER"}
            # The relay still gets in while every cap is full.
            await notify.stub.Ingest(
                notify_pb2.IngestRequest(event=event(f"f-race-{uuid.uuid4().hex}", 1)),
                metadata=SERVICE,
            )
            for c in calls:
                c.cancel()
            await _streams_closed(9)


async def _streams_closed(opened: int) -> None:
    """Wait until the server has released every stream slot (it sees the cancels)."""
    deadline = time.monotonic() + DEADLINE_S
    while sample("serentak_capacity_in_use", "streams") > 0:
        assert time.monotonic() < deadline, f"{opened} cancelled streams kept their slots"
        await asyncio.sleep(0.01)  # poll interval of the wait above
