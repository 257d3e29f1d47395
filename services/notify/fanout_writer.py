"""Writing accepted events' notifications and handing them to open streams after commit.

Two callers share it: the fan-out job (`fanout_job.py`) and Ingest itself (`inbox.py`),
which writes a small audience's notifications in its own transaction instead of queuing
a job (one transaction and one job-runtime hop fewer between commit and delivery).

Live delivery. What a transaction wrote is handed to the in-process `Broker` only after
it commits (an `after_commit` hook), so a stream never shows an uncommitted row; a
rollback (lost lease, lost idempotency race, a deadlock retried) publishes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from serentak.events.v1 import events_pb2
from sqlalchemy import String, bindparam, text, update
from sqlalchemy import event as sa_event
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import SessionTransaction

from services.common.correlation import bound_correlation_id, current_correlation_id
from services.common.logging import get_logger
from services.common.session_sql import FEW_ROWS, SessionStatements
from services.notify import fanout_batch, metrics
from services.notify.clock import to_naive_utc, utcnow
from services.notify.fanout import Written, audience, fan_out, lock_streams
from services.notify.models import AggregateVersion, InboxEvent, InboxStatus
from services.notify.streams import Broker
from services.notify.summaries import describe

log = get_logger(__name__)


def occurred_at(ev: events_pb2.Event) -> datetime:
    """When the event happened (naive UTC); now when the event does not say."""
    if ev.HasField("occurred_at"):
        return to_naive_utc(ev.occurred_at.ToDatetime())
    return utcnow()


# PostgreSQL's `bump_applied` statement, built once (the SQL the construct compiled to):
# no construct to compose and cache-key per Ingest that queues a job.
_PG_BUMP = text(
    "UPDATE notify_aggregate_versions SET applied_version = CAST(:version AS BIGINT) "
    "WHERE notify_aggregate_versions.aggregate_id = CAST(:aggregate_id AS VARCHAR)"
)


# A short chain's inbox rows marked notified, one statement per chain length.
_NOTIFIED = SessionStatements(
    lambda n: (
        update(InboxEvent)
        .where(InboxEvent.event_id.in_([bindparam(f"id_{i}", type_=String) for i in range(n)]))
        .values(status=InboxStatus.NOTIFIED)
    )
)


async def bump_applied(session: AsyncSession, applied: dict[str, int]) -> None:
    """Set each aggregate's applied version (its row locked by this transaction)."""
    postgresql = bool(applied) and session.get_bind().dialect.name == "postgresql"
    for aggregate_id, version in applied.items():
        if postgresql:
            await session.execute(_PG_BUMP, {"version": version, "aggregate_id": aggregate_id})
            continue
        await session.execute(
            update(AggregateVersion)
            .where(AggregateVersion.aggregate_id == aggregate_id)
            .values(applied_version=version)
        )


@dataclass(frozen=True, slots=True)
class Fanned:
    """What writing a chain did."""

    # To hand to this process's open streams after commit (on the one-statement path only
    # the rows of users with a stream open here; on the per-event path every row).
    published: list[Written]
    # Notifications written or folded, in all.
    stored: int
    # Rows UNIQUE (tenant, user, file, version) refused: written before.
    duplicates: int


class FanOutWriter:
    """Writes a chain of accepted events' notifications and publishes them after commit."""

    def __init__(self, broker: Broker, *, digest_window: timedelta) -> None:
        self._broker = broker
        self._window = digest_window

    @staticmethod
    def inline(chain: list[events_pb2.Event]) -> bool:
        """Whether Ingest may write `chain` itself: nothing of it can fold into a digest
        (on PostgreSQL then one statement, `fanout_batch`)."""
        return not any(describe(ev).digestible for ev in chain)

    async def write(
        self,
        session: AsyncSession,
        chain: list[events_pb2.Event],
        applied: dict[str, int] | None = None,
    ) -> Fanned:
        """Write every notification of `chain` (accepted events in version order per file,
        their inbox rows `applied` in this transaction) and mark them `notified`; move
        the `applied` aggregates' versions too (rows this transaction has locked)."""
        described = [describe(ev) for ev in chain]
        if fanout_batch.batchable(session, described):
            # PostgreSQL, nothing to fold: the whole chain in one statement, which also
            # marks the chain notified.
            occurred = [occurred_at(ev) for ev in chain]
            published, stored, duplicates = await fanout_batch.fan_out_chain(
                session, chain, described, occurred, utcnow(), self._broker.live_users(), applied
            )
            return Fanned(published, stored, duplicates)
        if len(chain) > 1:
            # Every user this transaction will notify, locked up front in one global
            # order (a single event's seq upsert already visits its users sorted).
            audiences: dict[str, set[str]] = {}
            for ev in chain:
                audiences.setdefault(ev.tenant_id, set()).update(audience(ev))
            for tenant_id, users in sorted(audiences.items()):
                await lock_streams(session, tenant_id, sorted(users))
        written: list[Written] = []
        duplicates = 0
        for ev, description in zip(chain, described, strict=True):
            fanned = await fan_out(
                session,
                ev,
                description,
                occurred_at=occurred_at(ev),
                now=utcnow(),
                window=self._window,
            )
            written.extend(fanned.written)
            duplicates += fanned.duplicates
        if len(chain) <= FEW_ROWS:
            ids = {f"id_{i}": ev.event_id for i, ev in enumerate(chain)}
            await _NOTIFIED.of(len(chain)).execute(session, ids)
        else:
            await session.execute(
                update(InboxEvent)
                .where(InboxEvent.event_id.in_([ev.event_id for ev in chain]))
                .values(status=InboxStatus.NOTIFIED)
            )
        await bump_applied(session, applied or {})
        return Fanned(written, len(written), duplicates)

    def publish_after_commit(
        self,
        session: AsyncSession,
        fanned: Fanned,
        chain: list[events_pb2.Event],
        *,
        inline: bool = False,
    ) -> None:
        """Hand what `fanned` publishes to open streams once `session`'s transaction
        commits (nothing on rollback); count it and log each event of `chain` under its
        correlation id."""
        ended = self._broker.committing(fanned.published)
        outcome = {"committed": False, "ended": False}

        def committed(_session: object) -> None:
            outcome["committed"] = True
            metrics.NOTIFICATIONS_WRITTEN.inc(fanned.stored)
            metrics.DIGESTS_MERGED.inc(sum(1 for w in fanned.published if w.merged))
            metrics.FANOUT_EVENTS.inc(len(chain))
            if inline:
                metrics.FANOUT_INLINE_EVENTS.inc(len(chain))
            if fanned.duplicates:
                metrics.DUPLICATES_PREVENTED.labels("notification").inc(fanned.duplicates)
            for ev in chain:
                with bound_correlation_id(ev.correlation_id or current_correlation_id()):
                    log.info(
                        "notifications_written",
                        event_id=ev.event_id,
                        file_id=ev.aggregate_id,
                        version=ev.version,
                        fanout="inline" if inline else "job",
                    )

        def transaction_ended(_session: object, transaction: SessionTransaction) -> None:
            if transaction.parent is None and not outcome["ended"]:
                outcome["ended"] = True
                # Publishes when committed; a rollback publishes nothing.
                ended(outcome["committed"])

        # Both callers commit after this returns (the job runtime with the idempotency
        # record, Ingest with the inbox rows).
        sa_event.listen(session.sync_session, "after_commit", committed, once=True)
        sa_event.listen(session.sync_session, "after_transaction_end", transaction_ended)
