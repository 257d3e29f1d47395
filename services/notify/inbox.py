"""Ingest: the inbox that makes event delivery idempotent and applies events in order.

Idempotency (invariant 9). The event's row is inserted under its primary key `event_id`
with ON CONFLICT DO NOTHING: a redelivery inserts nothing and stops there.

Order (invariant 10). Versions of one aggregate (a file or folder) are contiguous: every
change bumps the version by exactly one, starting at 1. With `applied` the last version
applied for the aggregate (row-locked for the transaction):
- `version <= applied`: skipped as old (counted);
- `version == applied + 1`: accepted now, and so are the parked successors that follow it
  without a hole (`applied + 2`, ...);
- `version > applied + 1`: parked in the inbox. It "retries later" without any resend:
  the transaction that accepts its predecessor accepts it too.
An aggregate's terminal event (`file.purged`) retires it when accepted: nothing after it
is accepted, in this transaction or any later one (`retirement.py`).

Fan-out. The events a transaction accepts are written as notifications either by that
transaction itself (inline) or by a fan-out job (`fanout_job.py`) it enqueues, one per
file however many events of it the transaction accepts; the job writes the file's
accepted events oldest first, so notifications follow version order. Either way a crash
at any point leaves the accepted event with its notifications or its queued job, or
nothing (a redelivery then does the work).

Inline fan-out. A file's accepted events are written in the accepting transaction (on
PostgreSQL in one statement, `fanout_batch.py`; on SQLite by the per-event path a job
would take, with no job to enqueue, claim and complete), and published to open streams
right after its commit, when
- none of them can fold into a digest (folds take the per-event path of the job),
- the transaction writes at most `inline_fanout_max` notifications in all (a big
  audience goes to a job: the aggregate stays locked while Ingest writes; of a file's
  chain that does not fit, the longest prefix that fits is written inline and the rest
  by one job, which writes the file's remaining accepted events after this commit), and
- no earlier accepted event of the file still waits for its job (status `applied` in the
  inbox, committed by another transaction). Only an Ingest transaction holding the
  file's aggregate row lock makes events `applied`, and this one holds it, so none can
  appear meanwhile; a job still writing them leaves them `applied` until it commits.
  Notifications therefore still follow version order per file: the job path takes the
  file's events until its backlog is written.
Exactly once holds as on the job path: the inbox rows go `applied -> notified` in the
transaction that writes the notifications, UNIQUE (tenant, user, file, version) backs it,
and a fan-out job that finds nothing `applied` changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from serentak.events.v1 import events_pb2
from serentak.notify.v1 import notify_pb2
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common import tracing
from services.common.correlation import bound_correlation_id, current_correlation_id
from services.common.jobs import enqueue
from services.common.logging import get_logger
from services.common.validation import MAX_PRINCIPAL_LENGTH
from services.notify import metrics
from services.notify.aggregate_lock import lock_aggregate
from services.notify.clock import utcnow
from services.notify.errors import InvalidEvent
from services.notify.fanout import audience
from services.notify.fanout_job import fanout_job
from services.notify.fanout_writer import FanOutWriter, bump_applied
from services.notify.inbox_rows import (
    finish_rows,
    insert_and_read,
    insert_row,
    pending_rows,
    row_values,
    waiting_for_job,
)
from services.notify.models import ID_LEN, InboxStatus
from services.notify.retirement import is_terminal, retire
from services.notify.sql import retrying
from services.notify.summaries import named_subject

log = get_logger(__name__)
Outcome = notify_pb2.IngestOutcome
# session.info key: aggregate_id -> the events this transaction accepted, in order.
_ACCEPTED = "notify_accepted"
# session.info key: aggregates with accepted events of other transactions still waiting
# for their fan-out job (this transaction's must wait behind them: a job, not inline).
_BEHIND = "notify_behind_job"
# session.info key: aggregate_id -> applied version, for the aggregates whose row this
# transaction has locked (an IngestBatch locks them all up front; each event then reads
# the version from here instead of a second upsert round trip).
_LOCKED = "notify_aggregates_locked"
# session.info key: aggregates whose terminal event this transaction accepted.
_RETIRING = "notify_aggregates_retiring"


@dataclass
class IngestResult:
    """What one Ingest call did."""

    outcome: int
    # Notifications the accepted events' fan-out jobs write (one per audience user).
    scheduled: int = 0
    applied: int = 0
    skipped_old: int = 0


def validate(event: events_pb2.Event, max_audience: int) -> None:
    """Reject an event the inbox cannot order or attribute (INVALID_ARGUMENT, INVALID_EVENT)."""
    for name in ("event_id", "event_type", "aggregate_id", "tenant_id"):
        value = getattr(event, name)
        if not value:
            raise InvalidEvent(name, "required")
        # Principals have one limit in every service (services.common.validation).
        limit = MAX_PRINCIPAL_LENGTH if name == "tenant_id" else ID_LEN
        if len(value) > limit:
            raise InvalidEvent(name, f"longer than {limit} characters")
    if event.version < 1:
        raise InvalidEvent("version", "must be >= 1")
    if len(event.audience_user_ids) > max_audience:
        raise InvalidEvent("audience_user_ids", f"more than {max_audience} users")
    if any(len(u) > MAX_PRINCIPAL_LENGTH for u in event.audience_user_ids):
        raise InvalidEvent(
            "audience_user_ids", f"a user id is longer than {MAX_PRINCIPAL_LENGTH} characters"
        )
    subject = named_subject(event)
    if subject is not None and subject[1] != event.aggregate_id:
        # Versions order one aggregate's events only: a notification filed under another
        # file would break that file's version order (the digest relies on it).
        raise InvalidEvent(
            subject[0],
            f"names {subject[1][:ID_LEN]!r}, not the event's aggregate_id {event.aggregate_id!r}",
        )


class Inbox:
    """Ingests events: deduplicates, orders per aggregate, queues their fan-out."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        max_audience: int,
        on_accepted: Callable[[], None] = lambda: None,
        writer: FanOutWriter | None = None,
        inline_max: int = 0,
    ) -> None:
        self._sessions = sessions
        self._max_audience = max_audience
        # Called after a commit that queued fan-out jobs: wakes the in-process workers.
        self._on_accepted = on_accepted
        # Inline fan-out: notifications one transaction may write itself (0 or no
        # writer: every accepted event goes to a fan-out job).
        self._writer = writer
        self._inline_max = inline_max if writer is not None else 0

    async def ingest(self, event: events_pb2.Event) -> IngestResult:
        """Store `event` and, when its turn has come, accept it (queue its fan-out)."""
        validate(event, self._max_audience)
        if not event.correlation_id:
            event.correlation_id = current_correlation_id()
        result, queued = await retrying(lambda: self._ingest_once(event))
        if queued:
            self._on_accepted()
        self._count(result)
        self._log(event, result)
        return result

    @staticmethod
    def _log(event: events_pb2.Event, result: IngestResult) -> None:
        # Under the event's own id: a batch call's id is only the first event's.
        with bound_correlation_id(event.correlation_id or current_correlation_id()):
            log.info(
                "event_ingested",
                event_id=event.event_id,
                file_id=event.aggregate_id,
                version=event.version,
                outcome=Outcome.Name(result.outcome),
                accepted=result.applied,
                notifications_scheduled=result.scheduled,
            )

    async def ingest_many(self, events: Sequence[events_pb2.Event]) -> list[IngestResult]:
        """`ingest` for each of `events`, in order, in one transaction (one commit, one
        wake-up): what the outbox relay's batches cost instead of a round trip and a
        commit per event. Every event is validated before any is stored."""
        for event in events:
            validate(event, self._max_audience)
        for event in events:
            if not event.correlation_id:
                event.correlation_id = current_correlation_id()
        results, queued = await retrying(lambda: self._ingest_many_once(events))
        if queued:
            self._on_accepted()
        for event, result in zip(events, results, strict=True):
            self._count(result)
            self._log(event, result)
        return results

    async def _ingest_many_once(
        self, events: Sequence[events_pb2.Event]
    ) -> tuple[list[IngestResult], bool]:
        async with self._sessions() as session, session.begin():
            # Every aggregate of the batch locked up front in sorted order, so batches
            # sharing aggregates cannot deadlock whatever order their events come in.
            for aggregate_id in sorted({ev.aggregate_id for ev in events}):
                await self._lock_aggregate(session, aggregate_id)
            results = []
            for event in events:
                # The call runs in its first event's trace; the others' work in theirs.
                with tracing.in_own_traces(
                    [event.traceparent], "notify ingest_event", event_id=event.event_id
                ):
                    results.append(await self._ingest_in(session, event))
            return results, await self._fan_out(session)

    async def _ingest_once(self, event: events_pb2.Event) -> tuple[IngestResult, bool]:
        async with self._sessions() as session, session.begin():
            result = await self._ingest_in(session, event)
            return result, await self._fan_out(session)

    async def _fan_out(self, session: AsyncSession) -> bool:
        """Write (inline) or queue (a job per file) the fan-out of every event this
        transaction accepted; True when it queued a job. See "Inline fan-out" above."""
        accepted: dict[str, list[events_pb2.Event]] = session.info.pop(_ACCEPTED, {})
        behind: set[str] = session.info.pop(_BEHIND, set())
        budget = self._inline_max
        inline: list[events_pb2.Event] = []
        queued = False
        locked: dict[str, int] = session.info.get(_LOCKED, {})
        applied = {aggregate_id: locked[aggregate_id] for aggregate_id in accepted}
        inline_applied: dict[str, int] = {}
        for aggregate_id, chain in accepted.items():
            take = 0
            if (
                aggregate_id not in behind
                and self._writer is not None
                and self._writer.inline(chain)
            ):
                # The longest prefix of the chain that fits the budget is written here;
                # a relay batch that grew while Ingest was slow (a stall, a loaded
                # machine) then does not move its whole chain onto the slower job path.
                size = 0
                for ev in chain:
                    users = len(audience(ev))
                    if size + users > budget:
                        break
                    size += users
                    take += 1
                budget -= size
            if take:
                inline.extend(chain[:take])
                inline_applied[aggregate_id] = applied.pop(aggregate_id)
            if take < len(chain):
                # The rest stays `applied`: this job writes it after the commit, oldest
                # first, behind the prefix (later transactions see it waiting: `behind`).
                # The job continues the trace of the event it starts from.
                with tracing.resumed(chain[take].traceparent, unless_current_trace=True):
                    await enqueue(session, fanout_job(chain[take]))
                queued = True
        await bump_applied(session, applied)
        await retire(session, session.info.pop(_RETIRING, ()), utcnow())
        if inline and self._writer is not None:
            # One statement for every file's chain (and their applied versions): users
            # are locked in one global order, per file in version order (`fanout_batch.py`).
            # One statement for events of several traces: a span of it in each one's.
            with tracing.in_own_traces(
                [ev.traceparent for ev in inline], "notify fanout_event", fanout="inline"
            ):
                fanned = await self._writer.write(session, inline, inline_applied)
            self._writer.publish_after_commit(session, fanned, inline, inline=True)
        return queued

    async def _ingest_in(self, session: AsyncSession, event: events_pb2.Event) -> IngestResult:
        # Lock the aggregate first: the inbox row is then inserted with its final
        # status. On PostgreSQL the common case is three statements (lock, insert with
        # the read of the aggregate's pending rows, then the inline fan-out, which also
        # moves the applied version); a batch that locked the aggregate already, two.
        locked: dict[str, int] = session.info.get(_LOCKED, {})
        applied = locked.get(event.aggregate_id)
        if applied is None:
            applied = await self._lock_aggregate(session, event.aggregate_id)
        if event.version <= applied or event.aggregate_id in session.info.get(_RETIRING, ()):
            status, outcome = InboxStatus.SKIPPED_OLD, Outcome.INGEST_OUTCOME_SKIPPED_OLD
        elif event.version > applied + 1:
            status, outcome = InboxStatus.PARKED, Outcome.INGEST_OUTCOME_PARKED
        else:
            status, outcome = InboxStatus.APPLIED, Outcome.INGEST_OUTCOME_APPLIED
        values = row_values(event, status, utcnow())
        rows: list[Any] | None = None
        behind = False
        # The first event the transaction accepts for the aggregate asks whether other
        # transactions' accepted events still wait for their job (later ones would see
        # this transaction's own).
        first = status == InboxStatus.APPLIED and event.aggregate_id not in session.info.get(
            _ACCEPTED, {}
        )
        if status == InboxStatus.APPLIED and session.get_bind().dialect.name == "postgresql":
            # One round trip: the insert, the aggregate's parked rows that accepting it
            # needs (read in the same snapshot, which cannot hold the new row; the
            # aggregate is locked, so nothing else changes them meanwhile) and that question.
            stored, rows, behind = await insert_and_read(session, values, check_behind=first)
        else:
            if first and self._inline_max:
                # SQLite: the same question, before the insert (one writer at a time).
                behind = await waiting_for_job(session, event.aggregate_id)
            stored = await insert_row(session, values)
        if stored is None:
            return IngestResult(Outcome.INGEST_OUTCOME_DUPLICATE)
        result = IngestResult(outcome)
        if status == InboxStatus.SKIPPED_OLD:
            result.skipped_old = 1
        elif status == InboxStatus.APPLIED:
            await self._accept_in_order(session, event, result, rows, behind=behind)
        return result

    async def _lock_aggregate(self, session: AsyncSession, aggregate_id: str) -> int:
        """The aggregate's applied version, its row (created if missing) locked until
        commit: one upsert whose no-op update takes the row lock."""
        version = await lock_aggregate(session, aggregate_id)
        session.info.setdefault(_LOCKED, {})[aggregate_id] = version
        return version

    async def _accept_in_order(
        self,
        session: AsyncSession,
        first: events_pb2.Event,
        result: IngestResult,
        rows: list[Any] | None = None,
        *,
        behind: bool = False,
    ) -> None:
        """Accept `first` (already stored as applied) and the parked successors that
        follow it without a hole, in version order, for the fan-out at the end of the
        transaction (`_fan_out`)."""
        aggregate_id = first.aggregate_id
        accepted: dict[str, list[events_pb2.Event]] = session.info.setdefault(_ACCEPTED, {})
        successors, stale = await self._parked_successors(
            session, aggregate_id, first.version, rows, ended=is_terminal(first)
        )
        if behind:
            session.info.setdefault(_BEHIND, set()).add(aggregate_id)
        chain = [first, *successors]
        if is_terminal(chain[-1]):
            # The aggregate's last event: retired with this commit (`_fan_out`).
            session.info.setdefault(_RETIRING, set()).add(aggregate_id)
        # Fanned out when the transaction ends (`_fan_out`): inline, or one fan-out job
        # per file per transaction, which writes every accepted event of the file from
        # the oldest on (`fanout_job.py`), this chain and any later one this transaction
        # accepts (an IngestBatch) included.
        accepted.setdefault(aggregate_id, []).extend(chain)
        for ev in chain:
            result.scheduled += len(audience(ev))
            result.applied += 1
        if successors:
            await self._finish(session, [ev.event_id for ev in successors], InboxStatus.APPLIED)
        # Written when the transaction ends (`_fan_out`), with the inline fan-out when
        # there is one: the row is locked, and this transaction reads it from here.
        session.info.setdefault(_LOCKED, {})[aggregate_id] = chain[-1].version
        if stale:
            # A second event_id claiming an accepted version is old news, not a hole.
            await self._finish(session, stale, InboxStatus.SKIPPED_OLD)
            result.skipped_old += len(stale)

    async def _parked_successors(
        self,
        session: AsyncSession,
        aggregate_id: str,
        version: int,
        rows: list[Any] | None = None,
        *,
        ended: bool = False,
    ) -> tuple[list[events_pb2.Event], list[str]]:
        """Parked events of the aggregate at `version + 1`, `version + 2`, ... up to the
        first hole or the terminal event (one per version: the earliest received wins),
        and the ids of parked events that this chain makes old (a second event for
        `version` or a chain version, anything after a terminal event; `ended`: the event
        at `version` is terminal); from `rows` (`inbox_rows.pending_rows`, in this
        order) when read."""
        if rows is None:
            rows = await pending_rows(session, aggregate_id, version)
        chain: list[events_pb2.Event] = []
        stale: list[str] = []
        expected = version + 1
        for row in rows:
            event_id, row_version, payload = row[0], row[1], row[2]
            if row_version < expected or ended:
                # A second event for a version already accepted, or one after the end.
                stale.append(event_id)
                continue
            if row_version > expected:
                break
            event = events_pb2.Event()
            event.ParseFromString(payload)
            chain.append(event)
            expected += 1
            ended = is_terminal(event)
        return chain, stale

    async def _finish(self, session: AsyncSession, event_ids: list[str], status: str) -> None:
        await finish_rows(session, event_ids, status, utcnow())

    @staticmethod
    def _count(result: IngestResult) -> None:
        if result.outcome == Outcome.INGEST_OUTCOME_DUPLICATE:
            metrics.DUPLICATES_PREVENTED.labels("inbox").inc()
        if result.outcome == Outcome.INGEST_OUTCOME_PARKED:
            metrics.EVENTS_PARKED.inc()
        metrics.EVENTS_SKIPPED_OLD.inc(result.skipped_old)
        metrics.EVENTS_APPLIED.inc(result.applied)
