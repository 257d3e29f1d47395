"""Subscribe: replay after a cursor then live; reconnects during a burst see no gap and no
duplicate; a slow stream is dropped without holding up anyone else."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest
from notify.harness import error_reason, event, user_md
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc

DEADLINE_S = 30.0


def subscribe(stub, user: str, cursor: str = "", device: str = "d1", max_batch: int = 0):
    request = notify_pb2.SubscribeRequest(cursor=cursor, device_id=device, max_batch=max_batch)
    return stub.Subscribe(request, metadata=user_md(user))


async def next_item(call) -> notify_pb2.SubscribeResponse:
    return await asyncio.wait_for(call.read(), DEADLINE_S)


async def test_replay_after_cursor_then_live_and_only_own(notify):
    await notify.ingest_all([event(f"f-sub-{i}", 1) for i in range(3)], parallel=1)
    await notify.settled()
    # Fan-out jobs of different files run concurrently: stream order is commit order.
    ordered = sorted(await notify.all_notifications("alice"), key=lambda n: int(n.cursor))
    first = ordered[0]
    alice = subscribe(notify.stub, "alice", first.cursor)
    bob_live = subscribe(notify.stub, "bob", "")
    replayed = [await next_item(alice), await next_item(alice)]
    assert [r.notification.file_id for r in replayed] == [n.file_id for n in ordered[1:]]
    # A stream opened without a cursor first says where "now" is (no notification).
    marker = await next_item(bob_live)
    assert not marker.HasField("notification")
    assert int(marker.cursor) == max(int(n.cursor) for n in await notify.all_notifications("bob"))
    await notify.ingest(event("f-bob", 1, audience=["bob"]))
    assert (await next_item(bob_live)).notification.file_id == "f-bob"
    await notify.ingest(event("f-live", 1, audience=["alice", "bob"]))
    live = await next_item(alice)
    assert (live.notification.file_id, live.notification.user_id) == ("f-live", "alice")
    assert int(live.cursor) > int(replayed[-1].cursor)
    assert (await next_item(bob_live)).notification.file_id == "f-live"
    alice.cancel()
    bob_live.cancel()


# Streams of one notification per message, and batching streams (SubscribeRequest.max_batch)
# of random sizes: a batch must end exactly where its cursor says.
@pytest.mark.parametrize("batch_sizes", [(0,), (2, 7, 64)], ids=["one_each", "batched"])
async def test_reconnect_with_cursor_during_a_burst_has_no_gap_and_no_duplicate(
    notify, batch_sizes
):
    rng = random.Random(13)
    total = 250
    events = [event(f"f-burst-{i}", 1, audience=["alice"]) for i in range(total)]
    producer = asyncio.create_task(notify.ingest_all(events, parallel=8))
    received: list[notify_pb2.Notification] = []
    cursor, reconnects = "0", 0
    while len(received) < total:
        max_batch = rng.choice(batch_sizes)
        call = subscribe(notify.stub, "alice", cursor, f"d{reconnects}", max_batch)
        wanted = len(received) + rng.randint(1, 40)
        while len(received) < min(wanted, total):
            item = await next_item(call)
            carried = list(item.notifications) if max_batch > 1 else [item.notification]
            assert carried and item.cursor == carried[-1].cursor
            received += carried
            cursor = item.cursor
        call.cancel()
        reconnects += 1
    await producer
    ids = [n.notification_id for n in received]
    assert len(ids) == len(set(ids)), "a notification was delivered twice"
    assert sorted(n.file_id for n in received) == sorted(e.aggregate_id for e in events)
    cursors = [int(n.cursor) for n in received]
    assert cursors == sorted(cursors)
    assert reconnects > 5


async def test_slow_subscriber_is_dropped_and_others_keep_receiving(notify_factory):
    # "fast" shares the service's event loop, so under load many fan-out commits can land
    # between two of its turns: its buffer has room for a scheduling hiccup (128), a reader
    # that keeps up, not one that wins every race. The unread stream still overflows: the
    # burst is far more than its buffer plus what HTTP/2 flow control holds in flight.
    async with notify_factory(stream_buffer_size=128) as notify:
        await notify.ingest(event("f-warm", 1, audience=["alice"]))
        options = [("grpc.http2.bdp_probe", 0)]
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{notify.service.app.bound_port}", options=options
        ) as slow_channel:
            slow = subscribe(notify_pb2_grpc.NotifyServiceStub(slow_channel), "alice", "0", "slow")
            fast = subscribe(notify.stub, "alice", "0", "fast")
            assert (await next_item(slow)).notification.file_id == "f-warm"
            assert (await next_item(fast)).notification.file_id == "f-warm"
            burst = [
                event(f"f-flood-{i}", 1, audience=["alice"], name="n" * 200) for i in range(1000)
            ]
            producer = asyncio.create_task(notify.ingest_all(burst, parallel=8))
            got = [(await next_item(fast)).notification.file_id for _ in burst]
            await producer
            assert sorted(got) == sorted(e.aggregate_id for e in burst)
            with pytest.raises(grpc.aio.AioRpcError) as dropped:
                while True:
                    await next_item(slow)
            assert dropped.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error_reason(dropped.value) == "SUBSCRIBER_TOO_SLOW"
            fast.cancel()


async def test_subscribe_rejects_bad_cursor_and_service_identity(notify):
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await next_item(subscribe(notify.stub, "alice", "not-a-cursor"))
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(bad.value) == "INVALID_CURSOR"
    call = notify.stub.Subscribe(
        notify_pb2.SubscribeRequest(),
        metadata=(("authorization", "Bearer dev-service-upload"),),
    )
    with pytest.raises(grpc.aio.AioRpcError) as service:
        await next_item(call)
    assert service.value.code() == grpc.StatusCode.PERMISSION_DENIED
