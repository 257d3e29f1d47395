"""A worker stopped while its job is finishing hands the job back at once (SQLite).

CI once saw the notify service outlive SIGTERM: the stop landed while a retention job was
recording its idempotency key (an INSERT .. RETURNING), the job's task never finished its
hand-back and a connection was never returned. The cancelled statement's unfetched rows
kept its cursor active, so closing the terminated connection left SQLite a "zombie" that
kept the job's transaction and the write lock; the hand-back's BEGIN IMMEDIATE waited out
the busy timeout behind it (`services/common/db.py::_rollback_and_close`).
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
async def test_a_worker_stopped_while_its_job_records_its_key_hands_the_job_back(
    runtime_db,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only shortens how long the broken version blocked (the 30 s busy timeout) before the
    # hand-back failed; the fixed one never waits for the lock here.
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
        # Just before the statement is queued to the connection's thread: the worker's
        # stop cancels the job's task while it awaits this statement.
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
    async with runtime_db.sessions() as session, session.begin():
        row = (await session.execute(select(jobs.c.status, jobs.c.lease_token))).one()
        recorded = (await session.execute(select(applied_jobs.c.idempotency_key))).all()
    assert (row.status, row.lease_token) == ("queued", None)  # claimable again
    assert recorded == []  # the cancelled attempt's transaction rolled back
