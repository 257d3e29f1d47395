"""Retired aggregates: how `notify_aggregate_versions` stops growing by one row per file.

A row cannot simply be deleted: a missing row reads as applied version 0, so a late
duplicate of an old event would look new, and the next event of a live file would wait
forever for versions 1..N. The upload service therefore ends an aggregate with a terminal
event when it deletes the file for good (the trash purge, the sync purge): `file.purged`
(`FilePurged` payload), at the version after the file's last, recorded in the outbox in
the purging transaction. Notify applies it in version order like any other event, after
every earlier one, and then:

- marks the aggregate retired (`retired_at`, in the accepting transaction); it sends
  nobody a notification for it (`fanout.audience`: the deletion was announced when it
  happened);
- skips every later event of it as old (`lock_aggregate` reads a retired row as
  `RETIRED`, beyond any version), and the parked events waiting behind the terminal one
  are made old at once;
- the retention job (`retention.py`) deletes the row, and any parked event of it, once
  it has been retired longer than `SERENTAK_RETIRED_AGGREGATE_RETENTION_SECONDS` (30
  days): longer than the upload service keeps published events in its outbox (7 days),
  so no redelivery of any of its events can still arrive to find the row gone.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta

from serentak.events.v1 import events_pb2
from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from services.notify.models import AggregateVersion, InboxEvent, InboxStatus

# What a retired aggregate's applied version reads as: every event is old (int64 max).
RETIRED = 2**63 - 1
# Payloads that end their aggregate.
TERMINAL_PAYLOADS = frozenset({"file_purged"})


def is_terminal(event: events_pb2.Event) -> bool:
    """Whether `event` is its aggregate's last (the file is gone for good)."""
    return event.WhichOneof("payload") in TERMINAL_PAYLOADS


async def retire(session: AsyncSession, aggregate_ids: Collection[str], now: datetime) -> None:
    """Mark `aggregate_ids` retired at `now` (their rows locked by this transaction,
    which applied their terminal events)."""
    if aggregate_ids:
        await session.execute(
            update(AggregateVersion)
            .where(AggregateVersion.aggregate_id.in_(sorted(aggregate_ids)))
            .values(retired_at=now)
        )


async def purge_retired(
    session: AsyncSession, older_than: timedelta, now: datetime
) -> tuple[int, int]:
    """Delete the aggregates retired before `now - older_than` and their parked events,
    in the caller's transaction; (aggregate rows, parked events) deleted."""
    a = AggregateVersion
    due = (a.retired_at.is_not(None), a.retired_at < now - older_than)
    parked = await session.execute(
        delete(InboxEvent)
        .where(
            InboxEvent.status == InboxStatus.PARKED,
            InboxEvent.aggregate_id.in_(select(a.aggregate_id).where(*due)),
        )
        # Nothing of these rows is loaded in the session: no state to synchronise.
        .execution_options(synchronize_session=False)
    )
    rows = await session.execute(delete(a).where(*due))
    return (
        rows.rowcount or 0,  # type: ignore[attr-defined]
        parked.rowcount or 0,  # type: ignore[attr-defined]
    )
