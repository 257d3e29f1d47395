"""Periodic jobs: racing schedulers enqueue exactly one job per tick."""

from __future__ import annotations

import asyncio

from sqlalchemy import select

from services.common.jobs import PeriodicSchedule, PeriodicScheduler
from services.common.jobs.models import jobs


async def test_replicas_racing_on_the_same_ticks_enqueue_one_job_each(runtime_db) -> None:  # type: ignore[no-untyped-def]
    schedule = PeriodicSchedule("purge", interval_seconds=60, payload={"what": "dead"})
    replicas = [
        PeriodicScheduler(runtime_db.sessions, [schedule], scheduler_id=f"r{i}") for i in range(5)
    ]
    ticks = [1_000_000.0 + 60 * n + 1 for n in range(6)]
    for now in ticks:
        won = await asyncio.gather(*(r.run_due(now) for r in replicas for _ in range(2)))
        assert sum(len(w) for w in won) == 1
    async with runtime_db.sessions() as session, session.begin():
        rows = (await session.execute(select(jobs.c.payload, jobs.c.idempotency_key))).all()
    assert sorted(r.payload["tick"] for r in rows) == [schedule.tick_at(t) for t in ticks]
    assert all(r.payload["what"] == "dead" for r in rows)
    assert len({r.idempotency_key for r in rows}) == len(ticks)
