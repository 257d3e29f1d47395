"""PostgreSQL LISTEN/NOTIFY wakes idle workers and relays in other processes."""

from __future__ import annotations

import asyncio

import pytest
from serentak.events.v1 import events_pb2

from services.common.jobs import (
    JobContext,
    JobRegistry,
    JobRuntime,
    NewJob,
    RuntimeOptions,
    Worker,
    enqueue,
)
from services.common.jobs.listener import JOBS_CHANNEL, OUTBOX_CHANNEL, CommitListener
from services.common.outbox.store import record_event

# Far longer than any wait below: a job picked up in time was woken, not polled.
POLL_S = 300.0
WAIT_S = 30.0


async def _wait(event: asyncio.Event) -> None:
    await asyncio.wait_for(event.wait(), WAIT_S)


def _postgresql_only(runtime_db) -> None:  # type: ignore[no-untyped-def]
    if runtime_db.dialect != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; SQLite relies on in-process wake()")


async def test_idle_worker_is_woken_by_an_enqueue_committed_elsewhere(runtime_db) -> None:  # type: ignore[no-untyped-def]
    _postgresql_only(runtime_db)
    ran = asyncio.Event()

    async def handler(ctx: JobContext) -> None:
        ran.set()

    registry = JobRegistry()
    registry.register("t", handler)
    worker = Worker(runtime_db.sessions, registry, worker_id="w", poll_interval=POLL_S)
    listener = CommitListener(runtime_db.engine.url, {JOBS_CHANNEL: worker.wake})
    tasks = [asyncio.create_task(listener.run())]
    try:
        await _wait(listener.listening)
        tasks.append(asyncio.create_task(worker.run()))
        await _wait(worker.idling)  # its first claim found nothing: next poll in 300 s
        rounds = worker.claim_rounds
        async with runtime_db.sessions() as session, session.begin():
            await enqueue(session, NewJob("t", {}, "a", "k1"))
        await _wait(ran)
        assert listener.received[JOBS_CHANNEL] >= 1
        assert worker.claim_rounds > rounds
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_rolled_back_enqueue_notifies_nobody(runtime_db) -> None:  # type: ignore[no-untyped-def]
    _postgresql_only(runtime_db)
    woken = asyncio.Event()
    listener = CommitListener(
        runtime_db.engine.url, {JOBS_CHANNEL: woken.set, OUTBOX_CHANNEL: woken.set}
    )
    task = asyncio.create_task(listener.run())
    try:
        await _wait(listener.listening)
        woken.clear()  # the listener's own "look once after connecting"
        async with runtime_db.sessions() as session:
            async with session.begin():
                await enqueue(session, NewJob("t", {}, "a", "rolled-back"))
                await session.rollback()
        # A committed event afterwards: the first notification that arrives is its own.
        async with runtime_db.sessions() as session, session.begin():
            await record_event(
                session,
                events_pb2.Event(
                    event_id="e1", event_type="x", aggregate_type="file", aggregate_id="f1"
                ),
            )
        await _wait(woken)
        assert listener.received == {JOBS_CHANNEL: 0, OUTBOX_CHANNEL: 1}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_runtime_listens_only_on_postgresql(runtime_db) -> None:  # type: ignore[no-untyped-def]
    async def handler(ctx: JobContext) -> None:
        return None

    registry = JobRegistry()
    registry.register("t", handler)
    runtime = JobRuntime(runtime_db.sessions, registry, RuntimeOptions(node_id="n"))
    off = JobRuntime(runtime_db.sessions, registry, RuntimeOptions(node_id="n", listen=False))
    assert off.listener is None
    if runtime_db.dialect == "postgresql":
        assert runtime.listener is not None
        assert runtime.listener.run in runtime.background()
    else:
        assert runtime.listener is None
