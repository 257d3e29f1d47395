"""A relay process for the crash test, and the recording subscriber tests share.

`python relay_proc.py URL --crash-after-publish` publishes with a subscriber that
records the delivery and then SIGKILLs its own process: killed after publish, before
the relay marks the event published.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

from serentak.events.v1 import events_pb2
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.db import create_engine, session_factory
from services.common.outbox import Relay

deliveries_metadata = MetaData()
# Every delivery, duplicates included.
deliveries = Table(
    "test_deliveries",
    deliveries_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("event_id", String(64), nullable=False),
    Column("aggregate_id", String(64), nullable=False),
    Column("version", Integer, nullable=False),
)
# What the subscriber applied: event_id UNIQUE is its deduplication.
applied_events = Table(
    "test_applied_events",
    deliveries_metadata,
    Column("event_id", String(64), primary_key=True),
)


class RecordingSubscriber:
    """Records each delivery and applies each event_id once."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], crash: bool = False) -> None:
        self.sessions = sessions
        self.crash = crash

    async def publish(self, event: events_pb2.Event) -> None:
        async with self.sessions() as session, session.begin():
            await session.execute(
                insert(deliveries).values(
                    event_id=event.event_id, aggregate_id=event.aggregate_id, version=event.version
                )
            )
            seen = await session.execute(
                select(applied_events.c.event_id).where(applied_events.c.event_id == event.event_id)
            )
            if seen.first() is None:
                await session.execute(insert(applied_events).values(event_id=event.event_id))
        if self.crash:
            os.kill(os.getpid(), signal.SIGKILL)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--crash-after-publish", action="store_true")
    args = parser.parse_args()
    engine = create_engine(args.url, sqlite_synchronous="NORMAL")
    sessions = session_factory(engine)
    relay = Relay(
        sessions,
        [RecordingSubscriber(sessions, args.crash_after_publish)],
        relay_id="doomed",
        lease_seconds=1.0,
    )
    await relay.publish_pending()


if __name__ == "__main__":
    asyncio.run(main())
