"""A worker stopped while its job is finishing stops at once and leaves SQLite's write
lock free, with the job done exactly once (SQLite).

CI once saw the notify service outlive SIGTERM: the stop landed while a retention job was
recording its idempotency key (an INSERT .. RETURNING), the job's task never finished its
hand-back and a connection was never returned. The cancelled statement's unfetched rows
kept its cursor active, so closing the terminated connection left SQLite a "zombie" that
kept the job's transaction and the write lock; the hand-back's BEGIN IMMEDIATE waited out
the busy timeout behind it (`services/common/db.py::_rollback_and_close`).

A write transaction's statements now run where they are called (`sqlite_cursor`), so the
stop cannot land inside that INSERT: it lands at the COMMIT, which SQLite completes.
"""

from __future__ import annotations

import asyncio

import pytest
import structlog
from sqlalchemy import event, select, text

from services.common import db
from services.common.jobs import JobContext, JobRegistry, NewJob, Worker, enqueue
from services.common.jobs.models import applied_jobs, jobs


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_worker_stopped_while_its_job_records_its_key_stops_with_the_job_done_once(
    runtime_db,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only shortens how long the broken version blocked (the 30 s busy timeout); the fixed
    # one never waits for the lock here.
    monkeypatch.setattr(db, "SQLITE_BUSY_TIMEOUT_MS", 1000)
    async with runtime_db.sessions() as session, session.begin():
        await session.execute(text("CREATE TABLE effects (k VARCHAR(64) PRIMARY KEY)"))
        await enqueue(session, NewJob("t", {}, "p", "k1"))

    async def handler(ctx: JobContext) -> None:
        # Writes (nothing): the job's transaction holds the write lock, as a sweep does,
        # and the job completes in it, recording its key with INSERT .. RETURNING.
        await ctx.session.execute(text("DELETE FROM effects WHERE k = 'none'"))

    registry = JobRegistry()
    registry.register("t", handler)
    # One slot: once its job runs the worker waits for the slot, not in a claim.
    worker = Worker(runtime_db.sessions, registry, worker_id="w", poll_interval=60, concurrency=1)
    stopping: list[asyncio.Task[None]] = []

    @event.listens_for(runtime_db.engine.sync_engine, "before_cursor_execute")
    def stop_at_record(_conn, _cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        # As the statement starts: the worker's stop cancels the job's task, which sees
        # it at its next wait (the COMMIT).
        if "INSERT INTO applied_jobs" in statement and stopping:
            stopping.pop().cancel()

    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(worker.run())
        stopping.append(task)
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not stopping  # the stop came at the recording
    events = [e["event"] for e in logs]
    assert "job_released" in events, events
    assert runtime_db.engine.sync_engine.pool.checkedout() == 0
    # The write lock is free at once (a zombie held it past this 1 s busy timeout).
    async with runtime_db.sessions() as session, session.begin():
        rows = (await session.execute(select(jobs.c.status, jobs.c.lease_token))).all()
        recorded = (await session.execute(select(applied_jobs.c.idempotency_key))).all()
    # The job's transaction committed with its key: done once, nothing to hand back.
    assert rows == []
    assert recorded == [("k1",)]
