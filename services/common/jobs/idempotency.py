"""Effects applied exactly once: each idempotency key is recorded under a unique constraint.

The record is written in the same transaction as the handler's effects and the job's
completion. Two workers racing on one key (a redelivery, a replay) both may run the
handler, but only one transaction can insert the key: the other fails on the constraint
and rolls back its effects with it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.jobs.job import ClaimedJob
from services.common.jobs.models import applied_jobs, utcnow


class AlreadyApplied(Exception):
    """Another job with this idempotency key committed its effect first."""


async def is_applied(session: AsyncSession, idempotency_key: str) -> bool:
    """True when an effect was already recorded under `idempotency_key`."""
    stmt = select(applied_jobs.c.id).where(applied_jobs.c.idempotency_key == idempotency_key)
    return (await session.execute(stmt)).first() is not None


async def record_applied(
    session: AsyncSession, job: ClaimedJob, effect: dict[str, Any] | None
) -> None:
    """Record `job`'s effect; raises AlreadyApplied if its key is taken.

    Run in a savepoint so the constraint violation is reported as AlreadyApplied
    (the caller then rolls the whole transaction back) rather than as a handler bug.
    """
    try:
        async with session.begin_nested():
            await session.execute(
                insert(applied_jobs).values(
                    idempotency_key=job.idempotency_key,
                    job_type=job.job_type,
                    job_id=job.job_id,
                    effect=effect,
                    applied_at=utcnow(),
                )
            )
    except IntegrityError as exc:
        raise AlreadyApplied(job.idempotency_key) from exc
