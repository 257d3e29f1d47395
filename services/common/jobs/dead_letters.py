"""The dead-letter queue: jobs that failed for good, kept whole for an operator to replay."""

from __future__ import annotations

import traceback as tb
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.jobs import sql
from services.common.jobs.errors import error_class_of
from services.common.jobs.job import ClaimedJob, NewJob
from services.common.jobs.models import dead_letters, utcnow
from services.common.jobs.queue import enqueue


@dataclass(frozen=True, slots=True)
class Replay:
    """Outcome of a replay: the new job's id, or enqueued=False if replayed before."""

    job_id: str
    enqueued: bool


class DeadLetterNotFound(LookupError):
    """No dead letter with that id."""


async def dead_letter(
    session: AsyncSession, job: ClaimedJob, exc: BaseException, worker_id: str
) -> bool:
    """Move `job` to the dead-letter table; False (nothing done) if the lease was lost."""
    lease = {"id": job.id, "lease_token": job.lease_token}
    taken = (await session.execute(sql.TAKE_FOR_DEAD_LETTER, lease)).first()
    if taken is None:
        return False
    await session.execute(
        insert(dead_letters).values(
            job_id=job.job_id,
            job_type=job.job_type,
            partition_key=job.partition_key,
            idempotency_key=job.idempotency_key,
            payload=job.payload,
            correlation_id=job.correlation_id,
            error_class=error_class_of(exc),
            error_type=f"{type(exc).__module__}.{type(exc).__qualname__}",
            error_message=str(exc)[:4000],
            traceback="".join(tb.format_exception(exc))[-16000:],
            attempts=job.attempts,
            worker_id=worker_id,
            first_attempt_at=taken.first_attempt_at,
            last_attempt_at=taken.last_attempt_at,
            enqueued_at=taken.enqueued_at,
            dead_at=utcnow(),
        )
    )
    return True


async def list_dead_letters(
    session: AsyncSession, *, job_type: str = "", after_id: int = 0, limit: int = 100
) -> list[dict[str, Any]]:
    """Dead letters in id order after `after_id`, optionally of one job type."""
    stmt = select(dead_letters).where(dead_letters.c.id > after_id)
    if job_type:
        stmt = stmt.where(dead_letters.c.job_type == job_type)
    stmt = stmt.order_by(dead_letters.c.id).limit(limit)
    return [dict(row._mapping) for row in (await session.execute(stmt))]


async def replay_dead_letter(session: AsyncSession, dead_letter_id: int) -> Replay:
    """Queue the dead letter's job again (same payload, partition and idempotency key).

    It goes through the idempotency check like any job: if its effect was applied
    meanwhile it is acknowledged without a second effect. A dead letter replays once:
    a second call returns enqueued=False and queues nothing.
    """
    row = (
        await session.execute(select(dead_letters).where(dead_letters.c.id == dead_letter_id))
    ).first()
    if row is None:
        raise DeadLetterNotFound(dead_letter_id)
    # Claim the replay first: on PostgreSQL a concurrent replay blocks on the row and then
    # finds replayed_at set; on SQLite the transaction is IMMEDIATE. Exactly one wins.
    marked = await session.execute(sql.MARK_REPLAYED, {"id": dead_letter_id, "now": utcnow()})
    if not marked.rowcount:  # type: ignore[attr-defined]
        return Replay(job_id=row.replay_job_id or "", enqueued=False)
    job_id = await enqueue(
        session,
        NewJob(
            job_type=row.job_type,
            payload=dict(row.payload),
            partition_key=row.partition_key,
            idempotency_key=row.idempotency_key,
            correlation_id=row.correlation_id,
        ),
    )
    await session.execute(
        update(dead_letters).where(dead_letters.c.id == dead_letter_id).values(replay_job_id=job_id)
    )
    return Replay(job_id=job_id, enqueued=True)


async def purge_dead_letters(
    session: AsyncSession, *, job_type: str = "", older_than: datetime | None = None
) -> int:
    """Delete dead letters (of one type, dead before `older_than`); returns how many."""
    stmt = delete(dead_letters)
    if job_type:
        stmt = stmt.where(dead_letters.c.job_type == job_type)
    if older_than is not None:
        stmt = stmt.where(dead_letters.c.dead_at < older_than)
    return int((await session.execute(stmt)).rowcount)  # type: ignore[attr-defined]


async def count_dead_letters(session: AsyncSession) -> dict[str, int]:
    """job_type -> number of dead letters."""
    stmt = select(dead_letters.c.job_type, func.count()).group_by(dead_letters.c.job_type)
    return {jt: int(n) for jt, n in (await session.execute(stmt))}
