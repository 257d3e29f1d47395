"""The notify service's rate limits (services/notify/rate_families.py): a Subscribe
stream spends a unit for its call and one per message it is sent, and ends RATE_LIMITED
(with RetryInfo) at the message past the limit; the relay's Ingest (a service principal)
is never limited; MarkRead has a family of its own."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from notify.harness import event, user_md
from serentak.notify.v1 import notify_pb2
from support.grpc_errors import error_info, retry_delay

DEADLINE_S = 30.0


async def test_subscribe_messages_count_and_the_relay_is_never_limited(notify_factory) -> None:
    # A day's window: the counts are fixed windows, and one starting mid-test would
    # give the stream a fresh budget (it once sent 3 where the limit leaves 2).
    async with notify_factory(
        rate_limit_subscribe_per_user=3,
        rate_limit_acks_per_user=2,
        rate_limit_window_seconds=86_400,
    ) as notify:
        alice = notify.stub.Subscribe(
            notify_pb2.SubscribeRequest(device_id="d"), metadata=user_md("alice")
        )
        bob = notify.stub.Subscribe(
            notify_pb2.SubscribeRequest(device_id="d"), metadata=user_md("bob")
        )
        # The call's unit pays for the first message ("now", no notification).
        for call in (alice, bob):
            marker = await asyncio.wait_for(call.read(), DEADLINE_S)
            assert not marker.HasField("notification")
        # Five events, each ingested by the relay's principal: none is refused.
        for i in range(5):
            await notify.ingest(event(f"f-rate-{i}", 1, audience=["alice", "bob"]))
        got = []
        with pytest.raises(grpc.aio.AioRpcError) as limited:
            while True:
                item = await asyncio.wait_for(alice.read(), DEADLINE_S)
                assert item is not grpc.aio.EOF
                got.append(item.notification.file_id)
        # Messages 2 and 3 came; the 4th was refused and the stream ended with the status.
        assert len(got) == 2
        exc = limited.value
        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        info = error_info(exc)
        assert (info.reason, info.metadata["family"], info.metadata["scope"]) == (
            "RATE_LIMITED",
            "subscribe",
            "user",
        )
        assert 0 < retry_delay(exc) <= 86_400  # until the window ends
        bob.cancel()
        # MarkRead is counted apart from Subscribe.
        outcomes = []
        for _ in range(3):
            try:
                await notify.stub.MarkRead(
                    notify_pb2.MarkReadRequest(up_to_cursor="0"), metadata=user_md("carol")
                )
                outcomes.append("admitted")
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                outcomes.append(error_info(err).metadata["family"])
        assert outcomes == ["admitted", "admitted", "acks"]
