"""Other replicas' commits reach this replica's streams as deliveries read once per burst
(PostgreSQL): a commit for many users whose streams sit on another replica costs that
replica one read, not one per stream; every stream still gets each notification once, in
order; rows that do not fit a stream's buffer, a failed read and a wide jump all fall back
to the stream reading by itself, never to an overflow or a lost wake-up."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog
from notify.harness import SERVICE, event, read_stream, start_notify, user_md
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc

from services.common.config import DEFAULT_AUTH_TOKENS
from services.common.db import create_engine, session_factory
from services.notify import metrics
from services.notify.database import prepare
from services.notify.remote_deliveries import MAX_GAP, RemoteDeliveries
from services.notify.settings import NotifySettings
from services.notify.streams import Broker, Delivery, Subscription

pytestmark = pytest.mark.postgres
DEADLINE_S = 60.0


def _settings(url: str, data_dir: Path, users: list[str], **overrides: Any) -> NotifySettings:
    tokens = dict(DEFAULT_AUTH_TOKENS)
    tokens.update({f"tok-{u}": {"tenant_id": "acme", "user_id": u} for u in users})
    data_dir.mkdir(exist_ok=True)
    return NotifySettings(
        notify_database_url=url, data_dir=data_dir, auth_tokens=tokens, **overrides
    )


async def _stream(
    stub: notify_pb2_grpc.NotifyServiceStub, user: str
) -> tuple[grpc.aio.UnaryStreamCall, int]:
    """A live stream of `user` (new notifications only) and its starting position."""
    call = stub.Subscribe(notify_pb2.SubscribeRequest(device_id="b"), metadata=user_md(user))
    marker = await asyncio.wait_for(call.read(), DEADLINE_S)
    return call, int(marker.cursor)


def _remote_reads() -> float:
    return metrics.REMOTE_READS._value.get()  # type: ignore[attr-defined]


async def test_a_commit_for_many_users_on_another_replica_is_one_read_not_one_per_stream(
    postgres, tmp_path
):
    url = postgres.create()
    users = [f"u{i:02d}" for i in range(40)]
    events = 6
    async with (
        start_notify(_settings(url, tmp_path / "a", users)) as a,
        start_notify(_settings(url, tmp_path / "b", users)) as b,
    ):
        streams = [await _stream(b.stub, u) for u in users]
        before = _remote_reads()
        readers = [asyncio.create_task(read_stream(call, events)) for call, _ in streams]
        for version in range(1, events + 1):  # committed on A only, one after the other
            ev = event("f-remote", version, audience=users, actor="dave")
            await a.stub.Ingest(notify_pb2.IngestRequest(event=ev), metadata=SERVICE)
        got = await asyncio.gather(*readers)
        reads = _remote_reads() - before
    for (_, start), notes in zip(streams, got, strict=True):
        assert [n.version for n in notes] == list(range(1, events + 1))
        assert [int(n.cursor) for n in notes] == list(range(start + 1, start + events + 1))
    # 40 users x 6 commits woken on B: at most a read per commit (bursts coalesce).
    assert 1 <= reads <= events


async def test_remote_rows_that_do_not_fit_a_streams_buffer_wake_it_instead(postgres, tmp_path):
    url = postgres.create()
    users = ["alice"]
    async with (
        start_notify(_settings(url, tmp_path / "a", users)) as a,
        start_notify(_settings(url, tmp_path / "b", users, stream_buffer_size=2)) as b,
    ):
        call, _ = await _stream(b.stub, "alice")
        reader = asyncio.create_task(read_stream(call, 11))
        first = event("f-burst", 1, audience=users)
        await a.stub.Ingest(notify_pb2.IngestRequest(event=first), metadata=SERVICE)
        # Ten versions in one commit: ten rows for a stream with room for two.
        burst = [event("f-burst", v, audience=users) for v in range(2, 12)]
        await a.stub.IngestBatch(notify_pb2.IngestBatchRequest(events=burst), metadata=SERVICE)
        got = await reader  # not dropped as too slow: the remote rows became a wake-up
    assert [n.version for n in got] == list(range(1, 12))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _taken_delivery(broker: Broker, user: str, seq: int) -> Subscription:
    """A stream of `user` that has taken the delivery of `seq` (handed out here)."""
    sub = broker.open("acme", user, "d")
    response = notify_pb2.SubscribeResponse(cursor=str(seq))
    broker.deliver_remote(("acme", user), [(seq, response)], seq, 0.0)
    delivered = await sub.next()
    assert isinstance(delivered, Delivery) and delivered.seq == seq
    return sub


@contextlib.asynccontextmanager
async def _broker_reading(url: str, *, running: bool = True) -> AsyncIterator[Broker]:
    """A broker whose remote wake-ups go through a `RemoteDeliveries` on `url`, its
    reader running (started and waited for) unless `running` is False."""
    engine = create_engine(url)
    broker = Broker(buffer_size=8)
    remote = RemoteDeliveries(session_factory(engine), broker)
    broker.attach_remote(remote)
    runner = asyncio.create_task(remote.run()) if running else None
    try:
        if runner is not None:
            await remote.running.wait()
        yield broker
    finally:
        if runner is not None:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
        await engine.dispose()


def _unreachable_database() -> str:
    """A database nobody listens on: reads fail (connection refused), for real."""
    return f"postgresql+psycopg://nobody:x@127.0.0.1:{_free_port()}/none"


async def test_a_failed_read_wakes_the_streams():
    async with _broker_reading(_unreachable_database()) as broker:
        sub = await _taken_delivery(broker, "alice", 3)
        with structlog.testing.capture_logs() as logs:
            broker.wake("acme", "alice", 5)  # committed on another replica
            assert await asyncio.wait_for(sub.next(), DEADLINE_S) == 5  # reads by itself
        assert [e["event"] for e in logs] == ["remote_read_failed"]


async def test_a_jump_wider_than_max_gap_is_left_to_the_stream(postgres):
    url = postgres.create()
    prepare(url, migrate_on_start=True)
    async with _broker_reading(url) as broker:
        sub = await _taken_delivery(broker, "alice", 3)
        before = _remote_reads()
        broker.wake("acme", "alice", 3 + MAX_GAP + 1)
        assert await asyncio.wait_for(sub.next(), DEADLINE_S) == 3 + MAX_GAP + 1
        assert _remote_reads() == before  # woken without a read


async def test_without_a_running_reader_a_remote_commit_wakes_the_streams():
    # Built but never run (a replica's background task not started, or stopped).
    async with _broker_reading(_unreachable_database(), running=False) as broker:
        sub = await _taken_delivery(broker, "alice", 3)
        broker.wake("acme", "alice", 4)
        assert await asyncio.wait_for(sub.next(), DEADLINE_S) == 4
