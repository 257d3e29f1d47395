"""Thousands of Subscribe streams opened at once from one client all start: each gets its
first message (the "now" cursor). grpc refused calls at random past 1,000 it had not handed
to the application yet (its default pending-request limit), so ~10% of 2,000 streams opened
together ended CANCELLED before their handler ran (issue 37); notify now leaves room for a
replica's worth (`streams_max`). Each stream's starting position is read in batches
(services/notify/positions.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from notify.harness import start_notify
from serentak.notify.v1 import notify_pb2

from services.common.config import DEFAULT_AUTH_TOKENS
from services.notify.settings import NotifySettings

STREAMS = 2_500
USERS = 500  # five devices each: within the per-user cap
DEADLINE_S = 120.0


async def test_2500_streams_opened_at_once_all_receive_their_first_message(
    database_url: str, tmp_path: Path
) -> None:
    tokens = {
        **DEFAULT_AUTH_TOKENS,
        **{f"tok-u{i}": {"tenant_id": "acme", "user_id": f"u{i}"} for i in range(USERS)},
    }
    settings = NotifySettings(
        notify_database_url=database_url, data_dir=tmp_path, auth_tokens=tokens
    )
    async with start_notify(settings) as notify:
        calls = [
            notify.stub.Subscribe(
                notify_pb2.SubscribeRequest(device_id=f"d{n}"),
                metadata=(("authorization", f"Bearer tok-u{n % USERS}"),),
            )
            for n in range(STREAMS)
        ]
        try:
            firsts = await asyncio.wait_for(
                asyncio.gather(*(c.read() for c in calls), return_exceptions=True), DEADLINE_S
            )
            failed = [f for f in firsts if isinstance(f, BaseException)]
            assert failed == [], f"{len(failed)} streams never started: {failed[:3]}"
            assert all(
                isinstance(f, notify_pb2.SubscribeResponse)
                and f.cursor
                and not f.HasField("notification")
                for f in firsts
            )
        finally:
            for call in calls:
                call.cancel()
