"""Reading: pagination newest first, MarkRead, the badge under races, identity."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest
from notify.harness import error_reason, event, user_md
from serentak.notify.v1 import notify_pb2


async def test_list_pages_newest_first_and_unread_only(notify):
    await notify.ingest_all([event(f"f-page-{i}", 1) for i in range(7)], parallel=1)
    await notify.settled()
    seen, token = [], ""
    while True:
        page = await notify.stub.ListNotifications(
            notify_pb2.ListNotificationsRequest(page_size=3, page_token=token),
            metadata=user_md("alice"),
        )
        assert len(page.notifications) <= 3
        seen.extend(page.notifications)
        token = page.next_page_token
        if not token:
            break
    cursors = [int(n.cursor) for n in seen]
    assert cursors == sorted(cursors, reverse=True) and len(seen) == 7
    await notify.stub.MarkRead(
        notify_pb2.MarkReadRequest(notification_ids=[seen[0].notification_id]),
        metadata=user_md("alice"),
    )
    unread = await notify.all_notifications("alice", unread_only=True)
    assert [n.notification_id for n in unread] == [n.notification_id for n in seen[1:]]
    assert all(not n.read for n in unread)


async def test_mark_read_by_ids_and_up_to_cursor(notify):
    await notify.ingest_all([event(f"f-mark-{i}", 1) for i in range(6)], parallel=1)
    await notify.settled()
    oldest_first = sorted(await notify.all_notifications("alice"), key=lambda n: int(n.cursor))
    md = user_md("alice")
    resp = await notify.stub.MarkRead(
        notify_pb2.MarkReadRequest(up_to_cursor=oldest_first[2].cursor), metadata=md
    )
    assert (resp.marked, resp.unread_count) == (3, 3)
    again = await notify.stub.MarkRead(
        notify_pb2.MarkReadRequest(
            notification_ids=[oldest_first[0].notification_id, oldest_first[5].notification_id]
        ),
        metadata=md,
    )
    assert (again.marked, again.unread_count) == (1, 2)
    assert await notify.unread("alice") == 2
    assert await notify.unread("bob") == 6


async def test_concurrent_mark_read_and_new_notifications_keep_the_badge_exact(notify):
    rng = random.Random(5)
    md = user_md("alice")
    for round_no in range(4):
        events = [event(f"f-badge-{round_no}-{i}", 1) for i in range(40)]

        async def reader() -> None:
            for _ in range(15):
                page = await notify.stub.ListNotifications(
                    notify_pb2.ListNotificationsRequest(page_size=20, unread_only=True),
                    metadata=md,
                )
                if not page.notifications:
                    continue
                if rng.random() < 0.5:
                    picked = rng.sample(list(page.notifications), min(3, len(page.notifications)))
                    request = notify_pb2.MarkReadRequest(
                        notification_ids=[n.notification_id for n in picked]
                    )
                else:
                    request = notify_pb2.MarkReadRequest(up_to_cursor=page.notifications[-1].cursor)
                resp = await notify.stub.MarkRead(request, metadata=md)
                assert resp.unread_count >= 0

        await asyncio.gather(notify.ingest_all(events, parallel=8), reader(), reader())
        await notify.settled()
        listed = await notify.all_notifications("alice")
        assert await notify.unread("alice") == sum(1 for n in listed if not n.read)
        assert len(await notify.all_notifications("alice", unread_only=True)) == sum(
            1 for n in listed if not n.read
        )


async def test_another_users_notifications_are_unreachable(notify):
    await notify.ingest(event("f-private", 1, actor="carol", audience=["alice", "carol"]))
    await notify.ingest(
        event("f-evil", 1, actor="x", audience=["alice"], tenant="evil")
    )  # same user id, other tenant
    await notify.settled()
    alice = await notify.all_notifications("alice")
    assert [(n.file_id, n.tenant_id) for n in alice] == [("f-private", "acme")]
    assert await notify.all_notifications("bob") == []
    assert await notify.all_notifications("mallory") == []
    stolen = await notify.stub.MarkRead(
        notify_pb2.MarkReadRequest(
            notification_ids=[alice[0].notification_id], up_to_cursor=alice[0].cursor
        ),
        metadata=user_md("bob"),
    )
    assert stolen.marked == 0
    assert await notify.unread("alice") == 1
    with pytest.raises(grpc.aio.AioRpcError) as service_reads:
        await notify.stub.GetUnreadCount(
            notify_pb2.GetUnreadCountRequest(),
            metadata=(("authorization", "Bearer dev-service-upload"),),
        )
    assert service_reads.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as anonymous:
        await notify.stub.ListNotifications(notify_pb2.ListNotificationsRequest())
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize(
    ("request_", "field", "reason"),
    [
        (notify_pb2.ListNotificationsRequest(page_token="nope"), "page_token", "INVALID_CURSOR"),
        (notify_pb2.ListNotificationsRequest(page_size=-1), "page_size", "INVALID_ARGUMENT"),
        (notify_pb2.MarkReadRequest(), "notification_ids", "INVALID_ARGUMENT"),
        (notify_pb2.MarkReadRequest(up_to_cursor="-3"), "up_to_cursor", "INVALID_CURSOR"),
        (
            notify_pb2.MarkReadRequest(notification_ids=["zz"]),
            "notification_ids",
            "INVALID_ARGUMENT",
        ),
    ],
)
async def test_bad_reading_requests_are_invalid_argument(notify, request_, field, reason):
    method = (
        notify.stub.ListNotifications
        if isinstance(request_, notify_pb2.ListNotificationsRequest)
        else notify.stub.MarkRead
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await method(request_, metadata=user_md("alice"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(err.value) == reason
    assert field in (err.value.details() or "")
