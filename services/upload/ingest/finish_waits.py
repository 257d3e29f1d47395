"""Waiting on the server for an upload to finish: GetUpload's `wait_finished_ms`.

A client that needs its merge's outcome asks once and is answered the moment the upload
has left `uploading` / `merging` (completed, failed, aborted, expired), instead of polling
GetUpload. Two parts:

- `FinishSignals`, an in-process notifier keyed by upload id. Whatever finishes an upload
  in this process fires it *after its commit* (invariant 11's rule for caches: a waiter
  woken before the commit would read the old status, or a status a rollback undoes): the
  merge job's completion and failure (`merge/merge_job.py`, through `after_commit` on the
  job's session), the dead-merge sweep (`merge/stuck_merges.py`), expiry (`expiry.py`,
  `Uploads.expire_if_due`) and abort (`Uploads.abort`). A waiter on this replica is woken
  at once, with no query until then.
- A fallback for changes committed by *another* replica (the merge ran there): while
  anyone waits, this replica re-reads the status of every waited upload every
  `upload_wait_recheck_ms` (250 ms), in ONE query (`id IN (...)`, by primary key), and
  wakes those that finished. The cost is on the server, bounded and independent of the
  number of waiters: at most 4 small queries a second per replica with waiters, none
  without; a change committed elsewhere is seen within that period.

`UploadWaits` is the use case: the caller's rights are checked first (another tenant's or
user's upload is NOT_FOUND before any waiting), then the wait, cut to
`upload_wait_max_ms` and to the call's own deadline minus `DEADLINE_MARGIN_SECONDS`. When
it runs out the upload's current state is the answer, not an error. At most
`upload_wait_max_waiters` calls wait at once on a replica (each holds one of the server's
concurrent RPCs); past it the call is RESOURCE_EXHAUSTED / UPLOAD_WAITER_LIMIT. A
cancelled call (client gone, deadline) leaves nothing registered. A stopping replica
answers its waits at once (`FinishSignals.serve`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

from sqlalchemy import and_, or_, select
from sqlalchemy import event as sa_event
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, SessionTransaction

from services.common.auth import Identity
from services.common.errors import InvalidArgument
from services.common.logging import get_logger
from services.upload import metrics
from services.upload.errors import TooManyWaiters
from services.upload.ingest.uploads import Uploads
from services.upload.models import MERGING, UPLOADING, UploadRow, utcnow

log = get_logger(__name__)

# The answer must reach the caller before its deadline: the wait ends this much earlier.
DEADLINE_MARGIN_SECONDS = 0.2
# Upload ids a session will report as finished once it commits (see `after_commit`).
_PENDING = "serentak_finished_uploads"


def is_finished(upload: UploadRow) -> bool:
    """Whether the upload has left `uploading` and `merging` for good."""
    return upload.status not in (UPLOADING, MERGING)


class FinishSignals:
    """In-process notifier: wakes the GetUpload calls waiting on an upload id.

    `finished` and `wake_all` must be called only after the change committed;
    `after_commit` arranges that for a transaction still open. The fallback re-read
    (module docstring) runs only while someone waits."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession] | None = None,
        *,
        max_waiters: int = 500,
        recheck_seconds: float = 0.25,
    ) -> None:
        self._sessions = sessions
        self._max_waiters = max_waiters
        self._recheck_seconds = recheck_seconds
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._count = 0
        self._rechecks: asyncio.Task[None] | None = None
        # Set when the service stops: waits answer at once (see `serve`).
        self.stopping = False

    @property
    def waiting(self) -> int:
        """How many calls wait now."""
        return self._count

    @contextlib.contextmanager
    def watch(self, upload_id: str) -> Iterator[asyncio.Event]:
        """Register a waiter on `upload_id` for the block; its event is set on a finish
        (or a possible one: the waiter re-reads). UPLOAD_WAITER_LIMIT past the cap."""
        if self._count >= self._max_waiters:
            raise TooManyWaiters(
                f"{self._count} calls already wait on this replica; ask again without"
                " wait_finished_ms, or later",
                max_waiters=self._max_waiters,
            )
        woken = asyncio.Event()
        self._waiters.setdefault(upload_id, set()).add(woken)
        self._count += 1
        metrics.UPLOAD_WAITERS.set(self._count)
        self._start_rechecks()
        try:
            yield woken
        finally:
            waiters = self._waiters.get(upload_id)
            if waiters is not None:
                waiters.discard(woken)
                if not waiters:
                    del self._waiters[upload_id]
            self._count -= 1
            metrics.UPLOAD_WAITERS.set(self._count)

    def finished(self, *upload_ids: str) -> None:
        """Wake the waiters of `upload_ids` (call after the commit that finished them)."""
        for upload_id in upload_ids:
            for woken in self._waiters.get(upload_id, ()):
                woken.set()

    def wake_all(self) -> None:
        """Wake every waiter to re-read (after a commit that finished uploads in bulk)."""
        for waiters in self._waiters.values():
            for woken in waiters:
                woken.set()

    def after_commit(self, session: AsyncSession, upload_id: str) -> None:
        """Call `finished(upload_id)` once `session`'s current transaction commits;
        nothing if it rolls back. For a transaction someone else commits (a job's)."""
        info = session.info
        pending: set[str] | None = info.get(_PENDING)
        if pending is None:
            pending = info[_PENDING] = set()
            sa_event.listen(session.sync_session, "after_commit", self._on_commit)
            sa_event.listen(session.sync_session, "after_transaction_end", _on_end)
        pending.add(upload_id)

    def _on_commit(self, session: Session) -> None:
        pending: set[str] = session.info.get(_PENDING, set())
        ids = list(pending)
        pending.clear()
        self.finished(*ids)

    def _start_rechecks(self) -> None:
        if self._sessions is None or (self._rechecks is not None and not self._rechecks.done()):
            return
        self._rechecks = asyncio.get_running_loop().create_task(
            self._recheck_loop(), name="upload-wait-rechecks"
        )

    async def _recheck_loop(self) -> None:
        """While anyone waits: every `recheck_seconds`, one query for the waited uploads
        that finished (or are due to expire), and wake their waiters."""
        assert self._sessions is not None
        while self._waiters:
            await asyncio.sleep(self._recheck_seconds)
            ids = list(self._waiters)
            if not ids:
                break
            try:
                done = await self._finished_among(ids)
            except Exception:
                # The waiters still have their own deadline; the next round tries again.
                log.warning("upload_wait_recheck_failed", exc_info=True)
                continue
            metrics.UPLOAD_WAIT_RECHECKS.inc()
            self.finished(*done)

    async def _finished_among(self, ids: list[str]) -> list[str]:
        assert self._sessions is not None
        now = utcnow()
        query = select(UploadRow.id).where(
            UploadRow.id.in_(ids),
            or_(
                UploadRow.status.not_in((UPLOADING, MERGING)),
                # Idle past its expires_at: the waiter's re-read expires it.
                and_(UploadRow.status == UPLOADING, UploadRow.expires_at <= now),
            ),
        )
        async with self._sessions() as session:
            return list((await session.execute(query)).scalars())

    async def serve(self) -> None:
        """Background task of the service: when it is cancelled (the first step of a
        graceful stop), every wait answers its current state at once and new ones do not
        wait, so the server's grace period is not spent holding waiters; their clients ask
        again (elsewhere)."""
        try:
            await asyncio.Event().wait()
        finally:
            self.stopping = True
            self.wake_all()

    async def close(self) -> None:
        """Stop the fallback re-reads (service shutdown)."""
        task, self._rechecks = self._rechecks, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _on_end(session: Session, transaction: SessionTransaction) -> None:
    """A transaction ended without `after_commit` having reported it (a rollback): forget
    what it would have finished. Savepoints end inside their transaction: not those."""
    if transaction.parent is None:
        pending: set[str] | None = session.info.get(_PENDING)
        if pending:
            pending.clear()


class UploadWaits:
    """GetUpload, waiting on the server for the upload to finish (module docstring)."""

    def __init__(self, uploads: Uploads, signals: FinishSignals, *, max_wait_ms: int) -> None:
        self._uploads = uploads
        self._signals = signals
        self._max_wait_ms = max_wait_ms

    def budget(self, wait_ms: int, time_remaining: float | None) -> float:
        """Seconds to wait: `wait_ms`, at most the setting, ending before the deadline."""
        seconds = min(wait_ms, self._max_wait_ms) / 1000
        if time_remaining is not None:
            seconds = min(seconds, time_remaining - DEADLINE_MARGIN_SECONDS)
        return max(seconds, 0.0)

    async def get(
        self, identity: Identity, upload_id: str, wait_ms: int, time_remaining: float | None
    ) -> tuple[UploadRow, list[tuple[int, int]]]:
        """The caller's upload once finished, or as it is when the wait runs out."""
        if wait_ms < 0:
            raise InvalidArgument("wait_finished_ms", "must not be negative")
        # Rights first: NOT_FOUND before any waiting (or any waiter-cap refusal).
        upload, missing = await self._uploads.get(identity, upload_id)
        seconds = self.budget(wait_ms, time_remaining)
        if is_finished(upload) or seconds <= 0 or self._signals.stopping:
            return upload, missing
        with self._signals.watch(upload.id) as woken:
            started = time.monotonic()
            deadline = started + seconds
            outcome = "cancelled"
            try:
                while True:
                    # Read after registering: a finish committed meanwhile is seen here.
                    upload, missing = await self._uploads.get(identity, upload_id)
                    if is_finished(upload):
                        outcome = "finished"
                        return upload, missing
                    if self._signals.stopping:
                        outcome = "stopped"
                        return upload, missing
                    left = deadline - time.monotonic()
                    if left <= 0:
                        outcome = "timed_out"
                        return upload, missing
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(left):
                            await woken.wait()
                    woken.clear()
            finally:
                metrics.UPLOAD_WAIT_SECONDS.labels(outcome).observe(time.monotonic() - started)
