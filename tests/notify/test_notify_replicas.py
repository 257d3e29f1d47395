"""Notify across replicas (PostgreSQL): two notify processes on one database. Events are
ingested through either; a stream on either replica gets every notification of its user
exactly once, in order, whichever replica's worker committed it; a stream resumed from a
cursor on the other replica has neither gap nor duplicate. SQLite says it is single-replica."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import urllib.request

import grpc
import pytest
from notify.harness import SERVICE, event, read_stream, user_md
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from support.services import ServiceProcess, service_process

DEADLINE_S = 60.0
USERS = ("alice", "bob", "carol")


def _written(svc: ServiceProcess) -> float:
    """This replica's `serentak_notify_notifications_written_total` (its own fan-outs)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{svc.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    match = re.search(r"^serentak_notify_notifications_written_total (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


async def _collect(
    stub: notify_pb2_grpc.NotifyServiceStub, user: str, total: int, device: str
) -> list[notify_pb2.Notification]:
    """Read one stream (from cursor 0) until it has delivered `total` notifications."""
    call = stub.Subscribe(
        notify_pb2.SubscribeRequest(cursor="0", device_id=device), metadata=user_md(user)
    )
    return await read_stream(call, total, f"{user}@{device}")


async def _hopping(
    stubs: list[notify_pb2_grpc.NotifyServiceStub], user: str, total: int, seed: int
) -> tuple[list[notify_pb2.Notification], int]:
    """Read `user`'s stream, leaving after a few items each time and resuming from the last
    cursor on the other replica; returns what was received and how many hops it made."""
    rng = random.Random(seed)
    got: list[notify_pb2.Notification] = []
    cursor, hops = "0", 0
    while len(got) < total:
        stub = stubs[hops % len(stubs)]
        call = stub.Subscribe(
            notify_pb2.SubscribeRequest(cursor=cursor, device_id=f"hop{hops}"),
            metadata=user_md(user),
        )
        try:
            for _ in range(rng.randint(1, 12)):
                if len(got) == total:
                    break
                item = await asyncio.wait_for(call.read(), DEADLINE_S)
                assert item is not grpc.aio.EOF
                got.append(item.notification)
                cursor = item.cursor
        finally:
            call.cancel()
        hops += 1
    return got, hops


def _assert_exactly_once_in_order(got: list[notify_pb2.Notification], files: list[str]) -> None:
    ids = [n.notification_id for n in got]
    assert len(ids) == len(set(ids)), "a notification was delivered twice"
    assert sorted(n.file_id for n in got) == sorted(files), "a notification is missing"
    cursors = [int(n.cursor) for n in got]
    assert cursors == sorted(cursors), "delivered out of order"


@pytest.mark.postgres
@pytest.mark.slow
async def test_streams_on_both_replicas_get_every_notification_once_in_order(postgres, tmp_path):
    url = postgres.create()
    env = {"SERENTAK_NOTIFY_DATABASE_URL": url}
    total = 120
    files = [f"f-rep-{i}" for i in range(total)]
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(service_process("notify", tmp_path / "a", env))
        b = stack.enter_context(service_process("notify", tmp_path / "b", env))
        async with (
            grpc.aio.insecure_channel(a.address) as ca,
            grpc.aio.insecure_channel(b.address) as cb,
        ):
            sa, sb = notify_pb2_grpc.NotifyServiceStub(ca), notify_pb2_grpc.NotifyServiceStub(cb)
            # alice on A, bob on B, carol on both; alice also hops A <-> B with cursors.
            readers = [
                asyncio.create_task(_collect(sa, "alice", total, "a")),
                asyncio.create_task(_collect(sb, "bob", total, "b")),
                asyncio.create_task(_collect(sa, "carol", total, "ca")),
                asyncio.create_task(_collect(sb, "carol", total, "cb")),
            ]
            hopper = asyncio.create_task(_hopping([sa, sb], "alice", total, seed=13))
            gate = asyncio.Semaphore(8)

            async def ingest(i: int) -> None:
                stub = (sa, sb)[i % 2]
                ev = event(files[i], 1, actor="dave", audience=USERS)
                async with gate:
                    await stub.Ingest(notify_pb2.IngestRequest(event=ev), metadata=SERVICE)

            await asyncio.gather(*(ingest(i) for i in range(total)))
            streams = await asyncio.gather(*readers)
            hopped, hops = await hopper
        # Both replicas' workers committed fan-outs, so each stream heard the other's.
        assert _written(a) > 0 and _written(b) > 0, "one replica wrote every fan-out"
    for got in [*streams, hopped]:
        _assert_exactly_once_in_order(got, files)
    assert hops > 10
    print(
        f"\nreplicas: {total} events, {len(streams) + 1} streams x {total} notifications, "
        f"{hops} hops between replicas"
    )


def test_sqlite_notify_says_it_is_single_replica(tmp_path):
    with service_process("notify", tmp_path) as svc:
        log = svc.log_text()
    assert "notify_single_replica" in log
