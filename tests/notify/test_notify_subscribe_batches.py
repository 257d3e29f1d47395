"""Subscribe with max_batch: notifications already waiting travel together (a replay
page, a burst committed at once), in cursor order, never more than asked; a stream that
asks for none is unchanged. Resuming batched streams during a burst without gap or
duplicate: `test_notify_subscribe.py`."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from notify.harness import SERVICE, error_reason, event, user_md
from serentak.notify.v1 import notify_pb2

from services.notify.models import Notification
from services.notify.servicer import MAX_SUBSCRIBE_BATCH

DEADLINE_S = 30.0
GRPC_DEFAULT_RECEIVE_LIMIT = 4 * 1024 * 1024


def subscribe(stub, user: str, cursor: str = "", max_batch: int = 0, device: str = "d1"):
    request = notify_pb2.SubscribeRequest(cursor=cursor, device_id=device, max_batch=max_batch)
    return stub.Subscribe(request, metadata=user_md(user))


async def next_item(call) -> notify_pb2.SubscribeResponse:
    return await asyncio.wait_for(call.read(), DEADLINE_S)


def notifications_of(item: notify_pb2.SubscribeResponse) -> list[notify_pb2.Notification]:
    """A batching stream's item: its notifications, whose last cursor is the item's."""
    assert not item.HasField("notification"), "a batching stream filled `notification`"
    assert item.notifications, "an item after the marker carries notifications"
    assert item.cursor == item.notifications[-1].cursor
    return list(item.notifications)


async def read_batches(call, count: int) -> tuple[list[int], list[notify_pb2.Notification]]:  # type: ignore[no-untyped-def]
    """Read items until `count` notifications arrived: each item's size, and them all."""
    sizes: list[int] = []
    got: list[notify_pb2.Notification] = []
    while len(got) < count:
        batch = notifications_of(await next_item(call))
        sizes.append(len(batch))
        got += batch
    return sizes, got


async def test_a_replay_comes_in_batches_of_at_most_max_batch_in_cursor_order(notify):
    await notify.ingest_all([event(f"f-rb-{i}", 1, audience=["alice"]) for i in range(23)])
    await notify.settled()
    stored = sorted(await notify.all_notifications("alice"), key=lambda n: int(n.cursor))
    call = subscribe(notify.stub, "alice", "0", max_batch=5)
    sizes, got = await read_batches(call, len(stored))
    call.cancel()
    assert sizes == [5, 5, 5, 5, 3]
    assert [n.notification_id for n in got] == [n.notification_id for n in stored]


# A burst committed at once: one IngestBatch whose fan-out is written inline, in one
# statement, and published in one go after its commit. That path is PostgreSQL's (on
# SQLite each file's fan-out is a job of its own, committed apart).
@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_burst_committed_at_once_reaches_a_live_stream_as_one_message(
    notify_factory, database_url
):
    async with notify_factory() as notify:
        batching = subscribe(notify.stub, "alice", max_batch=64)
        single = subscribe(notify.stub, "alice", device="d2")
        for call in (batching, single):
            marker = await next_item(call)  # registered: what commits from now on is queued
            assert not marker.HasField("notification") and not marker.notifications
        burst = [event(f"f-burst-{i}", 1, audience=["alice"]) for i in range(30)]
        await ingest_at_once(notify, burst)
        together = notifications_of(await next_item(batching))
        assert [n.file_id for n in together] == [e.aggregate_id for e in burst]
        cursors = [int(n.cursor) for n in together]
        assert cursors == list(range(cursors[0], cursors[0] + 30))
        # A stream that did not ask for batches gets the same, one per message.
        alone = [await next_item(single) for _ in burst]
        assert all(not item.notifications for item in alone)
        assert [item.notification for item in alone] == together
        batching.cancel()
        single.cancel()


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_max_batch_never_exceeded_by_a_live_burst(notify_factory, database_url):
    async with notify_factory() as notify:
        call = subscribe(notify.stub, "alice", max_batch=4)
        await next_item(call)
        burst = [event(f"f-cap-{i}", 1, audience=["alice"]) for i in range(10)]
        await ingest_at_once(notify, burst)
        sizes, got = await read_batches(call, len(burst))
        call.cancel()
        assert sizes == [4, 4, 2]
        assert [n.file_id for n in got] == [e.aggregate_id for e in burst]


async def ingest_at_once(notify, events) -> None:  # type: ignore[no-untyped-def]
    await notify.stub.IngestBatch(notify_pb2.IngestBatchRequest(events=events), metadata=SERVICE)


async def test_max_batch_above_the_limit_is_refused_naming_the_field(notify):
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await next_item(subscribe(notify.stub, "alice", max_batch=MAX_SUBSCRIBE_BATCH + 1))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(refused.value) == "INVALID_ARGUMENT"
    assert "max_batch" in (refused.value.details() or "")


def test_the_largest_batch_of_the_largest_notifications_fits_a_clients_default_limit():
    # Every text column at its length in 4-byte characters, every number at its widest.
    columns = Notification.__table__.columns
    widest = "\U0001f600"
    message = notify_pb2.Notification(
        cursor=str(2**63 - 1), version=2**63 - 1, digest_count=2**31 - 1
    )
    for field in message.DESCRIPTOR.fields:
        if field.type == field.TYPE_STRING and field.name in columns:
            setattr(message, field.name, widest * columns[field.name].type.length)
    for stamp in (message.created_at, message.updated_at, message.read_at):
        stamp.FromNanoseconds(2**62)
    message.read = True
    batch = notify_pb2.SubscribeResponse(
        notifications=[message] * MAX_SUBSCRIBE_BATCH, cursor=message.cursor
    )
    assert batch.ByteSize() < GRPC_DEFAULT_RECEIVE_LIMIT


async def test_a_batching_stream_refuses_anonymous_callers_and_carries_only_the_callers_own(
    notify,
):
    with pytest.raises(grpc.aio.AioRpcError) as anonymous:
        await next_item(notify.stub.Subscribe(notify_pb2.SubscribeRequest(max_batch=64)))
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # Mallory (tenant evil) asks for everything from the start, in batches, while acme's
    # alice gets a burst: the first thing her stream carries is her own notification.
    mallory = subscribe(notify.stub, "mallory", "0", max_batch=64)
    await notify.ingest_all([event(f"f-acme-{i}", 1, audience=["alice"]) for i in range(10)])
    await notify.settled()
    await notify.ingest(event("f-evil", 1, actor="x", audience=["mallory"], tenant="evil"))
    carried = notifications_of(await next_item(mallory))
    mallory.cancel()
    assert [(n.file_id, n.tenant_id, n.user_id) for n in carried] == [("f-evil", "evil", "mallory")]
