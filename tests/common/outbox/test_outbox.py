"""The outbox: transactional record, ordered relay, crash between publish and mark, one relay."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections import defaultdict
from pathlib import Path

from common.outbox.relay_proc import (
    RecordingSubscriber,
    applied_events,
    deliveries,
    deliveries_metadata,
)
from serentak.events.v1 import events_pb2
from sqlalchemy import create_engine as create_sync_engine
from sqlalchemy import func, select

from services.common.db import sync_url
from services.common.jobs import NewJob, enqueue
from services.common.jobs.models import jobs
from services.common.outbox import Relay, record_event
from services.common.outbox.models import outbox_events

REPO = Path(__file__).resolve().parents[3]


def _event(aggregate_id: str, version: int) -> events_pb2.Event:
    return events_pb2.Event(
        event_id=uuid.uuid4().hex,
        event_type="file.renamed",
        aggregate_type="file",
        aggregate_id=aggregate_id,
        version=version,
        file_renamed=events_pb2.FileRenamed(file_id=aggregate_id, new_name=f"v{version}"),
    )


async def _count(db, table) -> int:  # type: ignore[no-untyped-def]
    async with db.sessions() as session, session.begin():
        return (await session.execute(select(func.count()).select_from(table))).scalar_one()


async def test_rolled_back_transaction_leaves_neither_job_nor_event(runtime_db) -> None:  # type: ignore[no-untyped-def]
    async with runtime_db.sessions() as session:
        async with session.begin():
            await record_event(session, _event("f1", 1))
            await enqueue(session, NewJob("t", {}, "f1", "k"))
            await session.rollback()
    assert await _count(runtime_db, outbox_events) == 0
    assert await _count(runtime_db, jobs) == 0
    async with runtime_db.sessions() as session, session.begin():
        await record_event(session, _event("f1", 1))
        await enqueue(session, NewJob("t", {}, "f1", "k"))
    assert await _count(runtime_db, outbox_events) == 1
    assert await _count(runtime_db, jobs) == 1


class OrderCheckingSubscriber:
    """Shared by competing relays: fails the test if an aggregate is published by two at once."""

    def __init__(self) -> None:
        self.in_flight: set[str] = set()
        self.versions: dict[str, list[int]] = defaultdict(list)
        self.overlaps = 0

    async def publish(self, event: events_pb2.Event) -> None:
        if event.aggregate_id in self.in_flight:
            self.overlaps += 1
        self.in_flight.add(event.aggregate_id)
        await asyncio.sleep(0)  # let the other relays run in the middle of a publish
        self.versions[event.aggregate_id].append(event.version)
        self.in_flight.discard(event.aggregate_id)


async def test_competing_relays_publish_each_aggregate_in_order_by_one_relay(runtime_db) -> None:  # type: ignore[no-untyped-def]
    aggregates, versions = 12, 8
    subscriber = OrderCheckingSubscriber()
    relays = [
        Relay(runtime_db.sessions, [subscriber], relay_id=f"r{i}", concurrency=4) for i in range(4)
    ]
    for version in range(1, versions + 1):
        async with runtime_db.sessions() as session, session.begin():
            for a in range(aggregates):
                await record_event(session, _event(f"f{a}", version))
        # Relays race over each round's new events.
        await asyncio.gather(*(r.publish_pending() for r in relays))
    while sum(await asyncio.gather(*(r.publish_pending() for r in relays))):
        pass
    assert subscriber.overlaps == 0
    assert len(subscriber.versions) == aggregates
    for published in subscriber.versions.values():
        assert published == list(range(1, versions + 1))  # in order, each exactly once
    async with runtime_db.sessions() as session, session.begin():
        unpublished = await session.execute(
            select(func.count()).where(outbox_events.c.published_at.is_(None))
        )
        assert unpublished.scalar_one() == 0


class FailingOnce:
    def __init__(self) -> None:
        self.failed = False
        self.seen: list[int] = []

    async def publish(self, event: events_pb2.Event) -> None:
        if event.version == 2 and not self.failed:
            self.failed = True
            raise ConnectionError("subscriber down")
        self.seen.append(event.version)


async def test_failed_publish_stops_the_aggregate_so_order_holds(runtime_db) -> None:  # type: ignore[no-untyped-def]
    async with runtime_db.sessions() as session, session.begin():
        for v in (1, 2, 3):
            await record_event(session, _event("f", v))
    subscriber = FailingOnce()
    relay = Relay(runtime_db.sessions, [subscriber], relay_id="r")
    assert await relay.publish_pending() == 1
    relay._backoff.clear()  # skip the retry delay: this test is about order, not time
    assert await relay.publish_pending() == 2
    assert subscriber.seen == [1, 2, 3]


async def test_relay_killed_between_publish_and_mark_republishes_applied_once(runtime_db) -> None:  # type: ignore[no-untyped-def]
    engine = create_sync_engine(sync_url(runtime_db.url))
    deliveries_metadata.create_all(engine)
    engine.dispose()
    event = _event("f1", 1)
    async with runtime_db.sessions() as session, session.begin():
        await record_event(session, event)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).with_name("relay_proc.py")),
        runtime_db.url,
        "--crash-after-publish",
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert await asyncio.wait_for(proc.wait(), 60) == -9  # SIGKILLed itself after publish
    async with runtime_db.sessions() as session, session.begin():
        published_at = (await session.execute(select(outbox_events.c.published_at))).scalar_one()
    assert published_at is None  # never marked
    # A new relay takes over once the dead relay's 1 s lease ends.
    relay = Relay(runtime_db.sessions, [RecordingSubscriber(runtime_db.sessions)], relay_id="next")
    deadline = asyncio.get_running_loop().time() + 30
    while not await relay.publish_pending():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.1)  # waiting for the lease to expire: a test about time
    async with runtime_db.sessions() as session, session.begin():
        delivered = (await session.execute(select(deliveries.c.event_id))).scalars().all()
        applied = (await session.execute(select(applied_events.c.event_id))).scalars().all()
        published_at = (await session.execute(select(outbox_events.c.published_at))).scalar_one()
    assert delivered == [event.event_id, event.event_id]  # received twice
    assert applied == [event.event_id]  # applied once
    assert published_at is not None
