"""Uploads stuck in `merging` behind a dead merge job: the sweep that fails them.

The merge handler records `merging -> failed` itself when it gives up (see
`merge_job.py`), but a merge job can die without its handler running: the runtime's
crash-loop guard (`WorkerLost`, every attempt lost its worker mid-merge) dead-letters it
before the handler is called, and a give-up whose own transaction failed (database down)
leaves nothing recorded. Clients would then see `merging` forever.

Each run of the `upload.expire` periodic job therefore looks for uploads in `merging`
whose merge job (idempotency key `merge:{upload_id}`) sits in the runtime's dead-letter
table, not replayed, with no job of that key still queued or running, and moves them
`merging -> failed` with the dead letter's error as the reason:

    UPDATE uploads SET status = 'failed', failure_reason = :reason, ...
     WHERE id = :id AND status = 'merging'
       AND EXISTS (SELECT 1 FROM dead_letters WHERE id = :dead_letter_id
                                                AND replayed_at IS NULL)

The conditions are re-checked by the UPDATE itself, so a merge that completed meanwhile
or a replay committed before it are never overwritten. A replay that commits after the
sweep finds the upload `failed`; its job then skips (status only moves forward).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import exists, literal, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.jobs.models import dead_letters, jobs
from services.common.logging import get_logger
from services.upload import metrics
from services.upload.ingest.finish_waits import FinishSignals
from services.upload.merge.merge_job import MERGE_JOB
from services.upload.models import FAILED, MERGING, UploadRow, utcnow

log = get_logger(__name__)

BATCH = 100
MAX_REASON = 2000


@dataclass(frozen=True, slots=True)
class DeadMerge:
    """A merging upload and the dead letter of its merge job."""

    upload_id: str
    dead_letter_id: int
    error: str


def _merge_key_of_upload() -> object:
    # 'merge:' || uploads.id -- the key `merge_job.merge_job` gives every merge job.
    return literal("merge:") + UploadRow.id


async def find_dead_merges(session: AsyncSession, limit: int = BATCH) -> list[DeadMerge]:
    """Merging uploads whose merge job is dead-lettered, not replayed and not queued again."""
    key = _merge_key_of_upload()
    queued_again = exists().where(jobs.c.idempotency_key == key)
    stmt = (
        select(
            UploadRow.id,
            dead_letters.c.id.label("dead_letter_id"),
            dead_letters.c.error_type,
            dead_letters.c.error_message,
        )
        .join(dead_letters, dead_letters.c.idempotency_key == key)
        .where(
            UploadRow.status == MERGING,
            dead_letters.c.job_type == MERGE_JOB,
            dead_letters.c.replayed_at.is_(None),
            ~queued_again,
        )
        .order_by(dead_letters.c.id.desc())
        .limit(limit)
    )
    found: dict[str, DeadMerge] = {}
    for row in await session.execute(stmt):
        # Newest dead letter first: when a replay died again, its error is the one to show.
        if row.id not in found:
            error = f"{row.error_type.rsplit('.', 1)[-1]}: {row.error_message}"
            found[row.id] = DeadMerge(row.id, int(row.dead_letter_id), error)
    return list(found.values())


async def fail_dead_merge(session: AsyncSession, dead: DeadMerge) -> bool:
    """Move `dead.upload_id` to `failed` if it is still merging and its letter unreplayed."""
    still_dead = exists().where(
        dead_letters.c.id == dead.dead_letter_id, dead_letters.c.replayed_at.is_(None)
    )
    now = utcnow()
    result = await session.execute(
        update(UploadRow)
        .where(UploadRow.id == dead.upload_id, UploadRow.status == MERGING, still_dead)
        .values(
            status=FAILED,
            failure_reason=f"merge job dead-lettered: {dead.error}"[:MAX_REASON],
            merge_finished_at=now,
            updated_at=now,
        )
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def fail_dead_merges(
    sessions: async_sessionmaker[AsyncSession], signals: FinishSignals | None = None
) -> int:
    """One sweep: fail up to BATCH uploads stuck behind a dead merge; returns how many.
    `signals` hears of each, after the commit (GetUpload calls waiting on them)."""
    async with sessions() as session:
        found = await find_dead_merges(session)
    if not found:
        return 0
    failed: list[str] = []
    async with sessions.begin() as session:
        for dead in found:
            if await fail_dead_merge(session, dead):
                failed.append(dead.upload_id)
                log.warning("merge_failed_by_sweep", upload_id=dead.upload_id, reason=dead.error)
    if signals is not None:
        signals.finished(*failed)
    metrics.MERGES.labels("failed").inc(len(failed))
    return len(failed)
