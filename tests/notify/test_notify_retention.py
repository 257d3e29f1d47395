"""Retention: the sweep purges read notifications older than the configured age and
finished inbox rows; unread notifications stay until their own, longer retention; parked
events stay."""

from __future__ import annotations

from datetime import timedelta

from notify.harness import event, user_md
from serentak.notify.v1 import notify_pb2

from services.common.db import create_engine, session_factory
from services.notify.clock import utcnow
from services.notify.retention import purge


async def test_sweep_purges_old_read_notifications_only(notify):
    events = [event(f"f-ret-{i}", 1) for i in range(4)]
    await notify.ingest_all(events, parallel=1)
    await notify.settled()
    parked = event("f-ret-parked", 5)
    assert (await notify.ingest(parked)).outcome == notify_pb2.INGEST_OUTCOME_PARKED
    alice = sorted(await notify.all_notifications("alice"), key=lambda n: int(n.cursor))
    await notify.stub.MarkRead(
        notify_pb2.MarkReadRequest(up_to_cursor=alice[1].cursor), metadata=user_md("alice")
    )
    engine = create_engine(notify.settings.database_url)
    try:
        sessions = session_factory(engine)
        age = timedelta(days=30)
        kept = await purge(sessions, read_older_than=age, inbox_older_than=age)
        assert (kept.notifications, kept.inbox_events) == (0, 0)
        later = await purge(
            sessions, read_older_than=age, inbox_older_than=age, now=utcnow() + 2 * age
        )
        assert (later.notifications, later.inbox_events) == (2, 4)
    finally:
        await engine.dispose()
    left = await notify.all_notifications("alice")
    # Fan-out jobs of different files run concurrently: stream order is commit order.
    assert sorted(n.file_id for n in left) == sorted(n.file_id for n in alice[2:])
    assert await notify.unread("alice") == 2
    assert len(await notify.all_notifications("bob")) == 4
    # The parked event is still waiting; a purged inbox row's redelivery is skipped as old.
    assert (await notify.ingest(parked)).duplicate
    assert (await notify.ingest(events[0])).outcome == notify_pb2.INGEST_OUTCOME_SKIPPED_OLD


async def test_unread_notifications_go_after_their_own_retention(notify):
    await notify.ingest_all([event(f"f-unread-{i}", 1) for i in range(3)], parallel=1)
    await notify.settled()
    assert await notify.unread("alice") == 3
    engine = create_engine(notify.settings.database_url)
    try:
        sessions = session_factory(engine)
        read_age, unread_age = timedelta(days=30), timedelta(days=180)
        # Past the read retention, not the unread one: every unread notification stays.
        kept = await purge(
            sessions,
            read_older_than=read_age,
            inbox_older_than=read_age,
            unread_older_than=unread_age,
            now=utcnow() + 2 * read_age,
        )
        assert kept.notifications == 0 and await notify.unread("alice") == 3
        gone = await purge(
            sessions,
            read_older_than=read_age,
            inbox_older_than=read_age,
            unread_older_than=unread_age,
            now=utcnow() + unread_age + timedelta(days=1),
        )
    finally:
        await engine.dispose()
    # Three for alice and three for bob (the events' audience); the badge drops with them.
    assert gone.notifications == 6
    assert await notify.unread("alice") == 0
    assert await notify.all_notifications("alice") == []
