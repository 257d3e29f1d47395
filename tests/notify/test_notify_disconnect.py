"""Notify's engine does not ping a connection at every checkout (a round trip on every
Ingest and stream read): a connection PostgreSQL dropped fails its first statement and the
transaction runs again, once, on a new one. Here every connection of the service is
killed with `pg_terminate_backend` while it is idle, and the calls in flight right after
(Ingest racing Ingest, reads, a new stream, MarkRead) all succeed, exactly once."""

from __future__ import annotations

import asyncio

import pytest
from notify.harness import event, user_md
from serentak.notify.v1 import notify_pb2
from support.postgres import terminate_other_sessions

DEADLINE_S = 30.0


async def _pooled(notify) -> int:
    """Idle connections in the service's pool."""
    return notify.parts.engine.pool.checkedin()


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_calls_after_the_server_dropped_every_connection_succeed_once(notify, database_url):
    # Warm the pool with several connections (concurrent calls), all then idle.
    await notify.ingest_all([event(f"f-drop-{f}", 1) for f in range(8)], parallel=8)
    assert await _pooled(notify) >= 2
    assert terminate_other_sessions(database_url) >= 2

    # Ingest racing Ingest, each on a dead pooled connection: every one applies, once.
    results = await notify.ingest_all([event(f"f-drop-{f}", 2) for f in range(8)], parallel=8)
    assert {r.outcome for r in results} == {notify_pb2.INGEST_OUTCOME_APPLIED}
    await notify.settled()
    got = await notify.all_notifications("alice")
    assert sorted((n.file_id, n.version) for n in got) == sorted(
        (f"f-drop-{f}", v) for f in range(8) for v in (1, 2)
    )

    # Reads, a new stream (its position read) and MarkRead, each right after a kill.
    terminate_other_sessions(database_url)
    assert await notify.unread("bob") == 16
    terminate_other_sessions(database_url)
    call = notify.stub.Subscribe(
        notify_pb2.SubscribeRequest(cursor="14", device_id="d"), metadata=user_md("alice")
    )
    async with asyncio.timeout(DEADLINE_S):
        replayed = [(await call.read()).notification for _ in range(2)]
    assert [int(n.cursor) for n in replayed] == [15, 16]
    terminate_other_sessions(database_url)
    # A live delivery after the kill reaches the open stream.
    await notify.ingest(event("f-drop-live", 1))
    async with asyncio.timeout(DEADLINE_S):
        live = (await call.read()).notification
    assert (live.file_id, int(live.cursor)) == ("f-drop-live", 17)
    call.cancel()
    terminate_other_sessions(database_url)
    marked = await notify.stub.MarkRead(
        notify_pb2.MarkReadRequest(up_to_cursor="17"), metadata=user_md("alice")
    )
    assert (marked.marked, marked.unread_count) == (17, 0)
