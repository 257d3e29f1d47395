"""Effects applied exactly once: each idempotency key is recorded under a unique constraint.

The record is written in the same transaction as the handler's effects and the job's
completion. Two workers racing on one key (a redelivery, a replay) both may run the
handler, but only one transaction can insert the key: the other finds it taken and
rolls back its effects with it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from services.common.jobs import sql
from services.common.jobs.job import ClaimedJob
from services.common.jobs.models import utcnow


class AlreadyApplied(Exception):
    """Another job with this idempotency key committed its effect first."""


async def record_applied(
    session: AsyncSession, job: ClaimedJob, effect: dict[str, Any] | None
) -> None:
    """Record `job`'s effect; raises AlreadyApplied if its key is taken.

    The caller then rolls the whole transaction back. The insert does nothing on a
    conflict (see `sql.RECORD_APPLIED`), so the transaction stays usable and no
    savepoint is needed to tell a taken key from a handler bug.
    """
    recorded = await session.execute(
        sql.RECORD_APPLIED,
        {
            "idempotency_key": job.idempotency_key,
            "job_type": job.job_type,
            "job_id": job.job_id,
            "effect": effect,
            "applied_at": utcnow(),
        },
    )
    if recorded.first() is None:
        raise AlreadyApplied(job.idempotency_key)
