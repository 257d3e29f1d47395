"""Acknowledging finished jobs many per round trip.

A job whose handler wrote nothing in its transaction (a no-op, or effects kept outside
this database and made idempotent by the handler) has nothing to commit with its
completion but the completion itself: deleting the job (if the lease is still ours) and
recording its idempotency key (if it was deleted). Those are gathered while the previous
batch is in flight and sent as one statement in one transaction (`sql.COMPLETE_BATCH_*`),
so a busy worker pays one commit for many jobs instead of one each. Nothing waits for a
batch to fill: a lone job is sent at once. Inside a running worker the PostgreSQL batch
goes over a connection of its own in autocommit mode: the statement is atomic on its own,
so a batch is one round trip (no pool checkout, BEGIN or COMMIT).

The outcome per job is the one the single-job path gives: completed, already applied
(its key was taken: the job is deleted, nothing recorded twice) or LeaseLost (someone
else owns the job now; nothing was changed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

from services.common.jobs import sql
from services.common.jobs.errors import LeaseLost
from services.common.jobs.idempotency import AlreadyApplied, record_applied
from services.common.jobs.job import ClaimedJob
from services.common.jobs.models import utcnow
from services.common.jobs.queue import complete
from services.common.logging import get_logger

log = get_logger(__name__)

MAX_BATCH = 128  # jobs per statement: bounds the statement's size and its transaction


@dataclass
class _Pending:
    job: ClaimedJob
    effect: dict[str, Any] | None
    done: asyncio.Future[bool]


class CompletionBatcher:
    """Completes jobs in batches; one flusher task runs while there is work."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions
        self._pending: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self._persistent = False
        self._connection: AsyncConnection | None = None
        self.batches = 0  # statements sent (observable for tests and tools)

    def keep_connection(self) -> None:
        """Send PostgreSQL batches over one autocommit connection until `close()`."""
        self._persistent = True

    async def complete(self, job: ClaimedJob, effect: dict[str, Any] | None) -> bool:
        """Delete `job` and record its key; True if recorded, False if already applied.

        Raises LeaseLost when the job is not ours any more (nothing changed).
        """
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(job, effect, done))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await done

    async def close(self) -> None:
        """Stop the flusher (a batch in flight is abandoned: those leases just expire)."""
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self._drop_connection()

    async def _drop_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()

    async def _autocommit_connection(self) -> AsyncConnection | None:
        """The batch connection (PostgreSQL, inside a running worker), else None."""
        if not self._persistent:
            return None
        if self._connection is None:
            engine = self.sessions.kw.get("bind")
            if not isinstance(engine, AsyncEngine) or engine.dialect.name != "postgresql":
                return None
            connection = await engine.connect()
            await connection.execution_options(isolation_level="AUTOCOMMIT")
            self._connection = connection
        return self._connection

    async def _flush(self) -> None:
        batch: list[_Pending] = []
        try:
            while self._pending:
                batch = [p for p in self._pending[:MAX_BATCH] if not p.done.done()]
                del self._pending[:MAX_BATCH]
                if batch:
                    await self._send(batch)
                batch = []
        finally:
            # Cancelled (the worker stops): whoever still waits learns it, and gives the
            # job back or leaves it to its lease.
            for p in (*batch, *self._pending):
                if not p.done.done():
                    p.done.set_exception(LeaseLost(p.job.job_id))
            self._pending.clear()

    async def _send(self, batch: list[_Pending]) -> None:
        self.batches += 1
        try:
            outcomes = await self._apply(batch)
        except Exception as exc:
            if len(batch) == 1:
                _settle(batch[0], exc)
                return
            # E.g. a deadlock with a racing transaction: each job on its own, once.
            log.warning("job_completion_batch_failed", jobs=len(batch), exc_info=True)
            for p in batch:
                try:
                    outcome = await self._apply_one(p)
                except Exception as exc:
                    _settle(p, exc)
                else:
                    _settle(p, outcome)
            return
        for p in batch:
            _settle(p, outcomes[p.job.id])

    async def _apply(self, batch: list[_Pending]) -> dict[int, bool | LeaseLost]:
        try:
            connection = await self._autocommit_connection()
            if connection is not None:
                rows = await connection.execute(sql.COMPLETE_BATCH_POSTGRESQL, _params(batch))
                return _outcomes(batch, rows)
        except Exception:
            await self._drop_connection()  # a broken connection is not reused
            raise
        async with self.sessions() as session, session.begin():
            if session.get_bind().dialect.name != "postgresql":
                return {p.job.id: await _one(session, p) for p in batch}
            result = await session.execute(sql.COMPLETE_BATCH_POSTGRESQL, _params(batch))
            return _outcomes(batch, result)

    async def _apply_one(self, p: _Pending) -> bool | LeaseLost:
        async with self.sessions() as session, session.begin():
            return await _one(session, p)


async def _one(session: AsyncSession, p: _Pending) -> bool | LeaseLost:
    """One job inside the batch's transaction (SQLite: in-process, no round trips)."""
    try:
        await complete(session, p.job)
    except LeaseLost as lost:
        return lost
    try:
        await record_applied(session, p.job, p.effect)
    except AlreadyApplied:
        return False  # deleted, its key was taken before: acknowledged, not recorded
    return True


def _params(batch: list[_Pending]) -> dict[str, object]:
    return {
        "ids": [p.job.id for p in batch],
        "lease_tokens": [p.job.lease_token for p in batch],
        "idempotency_keys": [p.job.idempotency_key for p in batch],
        "job_types": [p.job.job_type for p in batch],
        "job_ids": [p.job.job_id for p in batch],
        # As the single-job path stores it (JSON null for no effect).
        "effects": [json.dumps(p.effect) for p in batch],
        "applied_at": utcnow(),
    }


def _outcomes(batch: list[_Pending], rows: Any) -> dict[int, bool | LeaseLost]:
    by_id = {row.id: row for row in rows}
    return {
        p.job.id: (
            bool(by_id[p.job.id].recorded) if by_id[p.job.id].completed else LeaseLost(p.job.job_id)
        )
        for p in batch
    }


def _settle(p: _Pending, outcome: bool | BaseException) -> None:
    if p.done.done():
        return
    if isinstance(outcome, BaseException):
        p.done.set_exception(outcome)
    else:
        p.done.set_result(outcome)
