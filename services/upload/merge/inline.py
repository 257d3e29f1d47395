"""The inline merge: the request that completes an upload runs its merge job itself.

The job is the same `upload.merge` job the runtime would run (`merge_job.MergeHandler`,
idempotency key `merge:{upload_id}`), enqueued in the transaction that wins
`uploading -> merging` (invariant 3) but already leased to this process's inline worker
(`queue.enqueue_claimed`), which runs it at once with `Worker.execute`: the same merge
(merge_core, invariant 4), the same file lock `file:{file_id}` through the same
`FileLocks`, the same commit (`commit_content`: `check_uploader` and the fencing check
`commit_fenced` under the lock, invariant 7; version, outbox event and `merging ->
completed` in one transaction, invariants 5 and 6) and the same completion, recorded
under the job's idempotency key in that transaction (invariant 9), with heartbeats,
retries and dead-lettering by the job's retry policy.

So the inline run is not a second path but the job path without the hop: nobody else
runs the job while its lease holds (no race with the runtime, no second merge of the
upload), and nothing is lost on a crash: a process killed mid-request leaves the job
leased to nobody alive; once the lease lapses (`SERENTAK_WORKER_LEASE_SECONDS`) any worker
claims it as it claims a crashed worker's job and finishes the upload. A retry the job's
policy schedules (a lock wait that timed out, etcd unreachable, a stale token) is the
runtime's from then on.

The run is shielded from the calling RPC: a caller that goes away does not abandon a merge
half-way (it completes, or is handed back to the runtime at shutdown).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.jobs import ClaimedJob, JobRegistry, Worker
from services.common.jobs.queue import enqueue_claimed
from services.common.tasks import ShieldedWork
from services.upload.merge.merge_job import merge_job
from services.upload.models import UploadRow


class InlineMerges:
    """Claims merge jobs for the requests that start them and runs them there."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        registry: JobRegistry,
        *,
        node_id: str,
        lease_seconds: float,
    ) -> None:
        # Never started (`run`): it only executes the jobs handed to it.
        self._worker = Worker(
            sessions, registry, worker_id=f"{node_id}/inline", lease_seconds=lease_seconds
        )
        self._running = ShieldedWork()

    async def claim(self, session: AsyncSession, upload: UploadRow) -> ClaimedJob:
        """Enqueue `upload`'s merge job leased to this process (in the caller's
        transaction, the one that moved the upload to `merging`)."""
        return await enqueue_claimed(
            session, merge_job(upload), self._worker.worker_id, self._worker.lease_seconds
        )

    def small_claimer(
        self, max_bytes: int
    ) -> Callable[[AsyncSession, UploadRow], Awaitable[ClaimedJob | None]]:
        """A claimer for chunked uploads: claims (runs inline) only an upload of at most
        `max_bytes` in all; a bigger one's job goes to the runtime as before."""

        async def claim_if_small(session: AsyncSession, upload: UploadRow) -> ClaimedJob | None:
            if upload.total_size > max_bytes:
                return None
            return await self.claim(session, upload)

        return claim_if_small

    async def run(self, job: ClaimedJob) -> None:
        """Run a claimed merge job to its outcome (completed, retried by the runtime
        later, dead-lettered, or lost to another worker); shielded from cancellation."""
        await self._running.run(self._worker.execute(job))

    async def close(self) -> None:
        """Stop runs still going (shutdown): each hands its job back to the runtime."""
        await self._running.cancel()
