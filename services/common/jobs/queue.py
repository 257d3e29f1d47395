"""The job queue: enqueue in the caller's transaction, claim with a lease, finish.

The SQL that decides who runs what is in `sql.py`; this module binds parameters and
turns rows into `ClaimedJob`s.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import RowMapping, bindparam, case, func, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from services.common.correlation import current_correlation_id
from services.common.jobs import sql
from services.common.jobs.errors import LeaseLost
from services.common.jobs.idempotency import AlreadyApplied, record_applied
from services.common.jobs.job import ClaimedJob, NewJob
from services.common.jobs.models import QUEUED, RUNNING, WAITING, jobs, utcnow
from services.common.tracing import current_traceparent


def _is_postgresql(executor: AsyncSession | AsyncConnection) -> bool:
    if isinstance(executor, AsyncConnection):
        return executor.dialect.name == "postgresql"
    return executor.get_bind().dialect.name == "postgresql"


def _status_on_arrival() -> Any:
    """'waiting' with two jobs or more ahead in the partition (`arriving_partition`),
    else 'queued' (why not behind one: runtime_0003)."""
    ahead = jobs.alias("ahead")
    two_ahead = (
        select(ahead.c.id).where(ahead.c.partition_key == bindparam("arriving_partition")).limit(2)
    )
    counted = select(func.count()).select_from(two_ahead.subquery()).scalar_subquery()
    return case((counted >= 2, WAITING), else_=QUEUED)


def _upsert(dialect_insert: Any) -> Any:
    stmt = dialect_insert(jobs).values(status=_status_on_arrival())
    # The unique (job_type, dedupe_key) holds only for jobs not yet started (a claim clears
    # dedupe_key), so a conflict means "an open window exists": fold this job into it.
    return stmt.on_conflict_do_update(
        index_elements=[jobs.c.job_type, jobs.c.dedupe_key],
        set_={
            "payload": stmt.excluded.payload,
            "idempotency_key": stmt.excluded.idempotency_key,
            "correlation_id": stmt.excluded.correlation_id,
            "traceparent": stmt.excluded.traceparent,
            "collapsed": jobs.c.collapsed + 1,
        },
    ).returning(jobs.c.job_id)


# Built once, executed with each job's values: building the status subquery per call
# cost ~0.9 ms an enqueue here (SQLAlchemy's statement cache key over a new tree).
_INSERT = insert(jobs).values(status=_status_on_arrival())
_UPSERT = {"postgresql": _upsert(postgresql.insert), "sqlite": _upsert(sqlite.insert)}


def _validate(job: NewJob) -> None:
    if not job.job_type:
        raise ValueError("job_type is required")
    if not job.partition_key:
        raise ValueError("partition_key is required")
    if not job.idempotency_key:
        raise ValueError("idempotency_key is required")
    if job.run_after is not None and job.run_after.tzinfo is None:
        raise ValueError("run_after must be timezone-aware")


async def enqueue(session: AsyncSession, job: NewJob) -> str:
    """Add `job` in the caller's transaction (a rollback removes it); returns its job_id.

    A job with two or more jobs ahead in its partition is stored 'waiting': claims do not
    look at it until the job right ahead of it is deleted (`runtime_0003`). When tracing is
    on it stores the current span's traceparent, which its run continues (`runtime_0005`).

    With a `dedupe_key`, the job waits until its dedupe window closes; a job of the same
    type and key enqueued meanwhile collapses into it (latest payload and idempotency key
    win) and the returned job_id is the existing job's.
    """
    _validate(job)
    now = utcnow()
    run_after = job.run_after or now
    values = {
        "job_id": uuid.uuid4().hex,
        "job_type": job.job_type,
        "partition_key": job.partition_key,
        "idempotency_key": job.idempotency_key,
        "payload": job.payload,
        "correlation_id": job.correlation_id or current_correlation_id(),
        "traceparent": current_traceparent(),
        "arriving_partition": job.partition_key,
        "attempts": 0,
        "collapsed": 0,
        "run_after": run_after,
        "enqueued_at": now,
    }
    if job.dedupe_key is None:
        await session.execute(_INSERT, values)
        return str(values["job_id"])
    values["dedupe_key"] = job.dedupe_key
    values["run_after"] = max(run_after, now + timedelta(seconds=job.dedupe_window_seconds))
    upsert = _UPSERT["postgresql" if _is_postgresql(session) else "sqlite"]
    return str((await session.execute(upsert, values)).scalar_one())


async def enqueue_claimed(
    session: AsyncSession, job: NewJob, worker_id: str, lease_seconds: float
) -> ClaimedJob:
    """Add `job` in the caller's transaction already leased to `worker_id` (its first
    attempt), for a caller that runs it at once itself (`Worker.execute`).

    The row is an ordinary job from the start: no other worker claims it while the lease
    holds, and if the caller dies the lease ends and any worker claims it as it would a
    crashed worker's job (once it heads its partition). Completion, retry and
    dead-lettering go through the lease as for any claimed job, so its effect is applied
    once (the idempotency key). No dedupe window: a claimed job is started.
    """
    _validate(job)
    if job.dedupe_key is not None:
        raise ValueError("a job enqueued claimed cannot have a dedupe_key")
    now = utcnow()
    values: dict[str, Any] = {
        "job_id": uuid.uuid4().hex,
        "job_type": job.job_type,
        "partition_key": job.partition_key,
        "idempotency_key": job.idempotency_key,
        "payload": job.payload,
        "correlation_id": job.correlation_id or current_correlation_id(),
        "traceparent": current_traceparent(),
        "status": RUNNING,
        "attempts": 1,
        "collapsed": 0,
        "run_after": job.run_after or now,
        "enqueued_at": now,
        "first_attempt_at": now,
        "last_attempt_at": now,
        "claimed_by": worker_id,
        "lease_token": uuid.uuid4().hex,
        "lease_expires_at": now + timedelta(seconds=lease_seconds),
    }
    row_id = (await session.execute(insert(jobs).values(values).returning(jobs.c.id))).scalar_one()
    return ClaimedJob(
        id=row_id,
        job_id=values["job_id"],
        job_type=job.job_type,
        partition_key=job.partition_key,
        idempotency_key=job.idempotency_key,
        payload=dict(job.payload),
        correlation_id=values["correlation_id"],
        attempts=1,
        enqueued_at=now,
        run_after=values["run_after"],
        first_attempt_at=now,
        lease_token=values["lease_token"],
        claimed_by=worker_id,
        traceparent=values["traceparent"],
    )


async def claim_jobs(
    session: AsyncSession | AsyncConnection,
    worker_id: str,
    job_types: Iterable[str],
    lease_seconds: float,
    limit: int = 1,
) -> list[ClaimedJob]:
    """Lease up to `limit` of the oldest claimable jobs of `job_types`, oldest first.

    Each returned job heads its partition, so they are in distinct partitions. Runs in
    the caller's (short) transaction, on a session or a bare connection; commit it to
    make the leases visible. A job whose
    idempotency key is already applied comes back with `already_applied` set.
    """
    types = list(job_types)
    if not types or limit < 1:
        return []
    now = utcnow()
    stmt = sql.CLAIM_POSTGRESQL if _is_postgresql(session) else sql.CLAIM_SQLITE
    rows = (
        await session.execute(
            stmt,
            {
                "worker_id": worker_id,
                # One token for the batch: each lease is still checked by (id, token).
                "lease_token": uuid.uuid4().hex,
                "lease_until": now + timedelta(seconds=lease_seconds),
                "now": now,
                "job_types": types,
                "limit": limit,
            },
        )
    ).all()
    # RETURNING order is unspecified; handlers start oldest first.
    return sorted((_claimed(row._mapping) for row in rows), key=lambda job: job.id)


async def promote_stranded(session: AsyncSession | AsyncConnection) -> int:
    """Queue every partition head left 'waiting' by an enqueue that raced its
    predecessor's deletion (see `sql.PROMOTE_STRANDED`); how many were."""
    result = await session.execute(sql.PROMOTE_STRANDED)
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


async def claim_next_job(
    session: AsyncSession,
    worker_id: str,
    job_types: Iterable[str],
    lease_seconds: float,
) -> ClaimedJob | None:
    """Lease the oldest claimable job of `job_types` to `worker_id`, or None.

    Runs in the caller's (short) transaction; commit it to make the lease visible.
    """
    claimed = await claim_jobs(session, worker_id, job_types, lease_seconds, limit=1)
    return claimed[0] if claimed else None


def _claimed(m: RowMapping) -> ClaimedJob:
    return ClaimedJob(
        id=m["id"],
        job_id=m["job_id"],
        job_type=m["job_type"],
        partition_key=m["partition_key"],
        idempotency_key=m["idempotency_key"],
        payload=dict(m["payload"]),
        correlation_id=m["correlation_id"],
        attempts=m["attempts"],
        enqueued_at=m["enqueued_at"],
        run_after=m["run_after"],
        first_attempt_at=m["first_attempt_at"],
        lease_token=m["lease_token"],
        claimed_by=m["claimed_by"],
        already_applied=bool(m["already_applied"]),
        traceparent=m["traceparent"],
    )


def _lease(job: ClaimedJob) -> dict[str, object]:
    return {"id": job.id, "lease_token": job.lease_token}


async def heartbeat(session: AsyncSession, job: ClaimedJob, lease_seconds: float) -> bool:
    """Extend the lease; False when it was lost (the job may be running elsewhere)."""
    result = await session.execute(
        sql.HEARTBEAT,
        {**_lease(job), "lease_until": utcnow() + timedelta(seconds=lease_seconds)},
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def complete(session: AsyncSession, job: ClaimedJob) -> None:
    """Delete the finished job; raises LeaseLost (the caller must roll back) if not ours."""
    result = await session.execute(sql.COMPLETE, _lease(job))
    if not result.rowcount:  # type: ignore[attr-defined]
        raise LeaseLost(job.job_id)


async def complete_applied(
    session: AsyncSession, job: ClaimedJob, effect: dict[str, Any] | None
) -> None:
    """Record `job`'s effect under its idempotency key and delete the job, atomically.

    Raises LeaseLost if the lease is gone, AlreadyApplied if the key was taken; either
    way the caller must roll back (the handler's effects go with it). One round trip on
    PostgreSQL, two on SQLite (in-process, no network).
    """
    if _is_postgresql(session):
        done = (
            await session.execute(sql.COMPLETE_AND_RECORD_POSTGRESQL, _applied(job, effect))
        ).one()
        if not done.completed:
            raise LeaseLost(job.job_id)
        if not done.recorded:
            raise AlreadyApplied(job.idempotency_key)
        return
    await complete(session, job)
    await record_applied(session, job, effect)


def _applied(job: ClaimedJob, effect: dict[str, Any] | None) -> dict[str, object]:
    return {
        **_lease(job),
        "idempotency_key": job.idempotency_key,
        "job_type": job.job_type,
        "job_id": job.job_id,
        "effect": effect,
        "applied_at": utcnow(),
    }


async def reschedule(
    session: AsyncSession,
    job: ClaimedJob,
    run_after: datetime,
    error_class: str,
    error_message: str,
) -> bool:
    """Queue the job again for `run_after`; False if the lease was lost meanwhile."""
    result = await session.execute(
        sql.RESCHEDULE,
        {
            **_lease(job),
            "run_after": run_after,
            "error_class": error_class,
            "error_message": error_message[:4000],
        },
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def release(session: AsyncSession, job: ClaimedJob) -> bool:
    """Give the job back without counting the attempt (shutdown); False if not ours."""
    result = await session.execute(sql.RELEASE, _lease(job))
    return bool(result.rowcount)  # type: ignore[attr-defined]
