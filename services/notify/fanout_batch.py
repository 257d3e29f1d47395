"""PostgreSQL fan-out fast path: a whole chain of events in two statements.

`fanout.fan_out` writes one event at a time with multi-row statements whose text grows
with the audience (SQLAlchemy's "insertmanyvalues": 400 rows x 15 columns of parameters a
statement, which psycopg re-parses every time; that parse was most of a fan-out's CPU).
Here the rows travel as arrays and `unnest` spreads them, so the statement text is
constant (parsed and planned once per connection) and its size does not depend on N:

1. one upsert takes every (tenant, user)'s stream positions for the whole chain: a user
   notified by k events of the chain gets `last_seq + 1 .. last_seq + k`, one per event in
   version order. Rows are visited in (tenant, user) order, the global lock order of
   `fanout.lock_streams`, so chains sharing users cannot deadlock;
2. one INSERT ... SELECT writes every notification of the chain: per-row arrays (id, user,
   seq, event index) joined to per-event arrays (the state every recipient shares), so an
   event's text is bound once, not once per recipient. ON CONFLICT DO NOTHING keeps UNIQUE
   (tenant, user, file, version) as the backstop of exactly-once, as on the slow path.

Only for chains of events that never fold into a digest (content updates, deletes, shares
...): a fold must look at each user's latest notification between events, which the
per-event path (`fanout.fan_out`) does. SQLite always takes that path.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from datetime import datetime

from serentak.events.v1 import events_pb2
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from services.notify.fanout import Written, audience
from services.notify.summaries import Description

_TAKE_SEQS = text(
    """
INSERT INTO notify_user_streams AS s (tenant_id, user_id, last_seq)
SELECT x.tenant_id, x.user_id, x.n
FROM unnest(CAST(:tenants AS varchar[]), CAST(:users AS varchar[]), CAST(:counts AS bigint[]))
     AS x(tenant_id, user_id, n)
ORDER BY x.tenant_id, x.user_id
ON CONFLICT (tenant_id, user_id) DO UPDATE SET last_seq = s.last_seq + EXCLUDED.last_seq
RETURNING s.tenant_id, s.user_id, s.last_seq
"""
)
_INSERT = text(
    """
INSERT INTO notifications (
    notification_id, tenant_id, user_id, seq, file_id, version, event_type, event_id,
    actor_user_id, file_name, summary, dedupe_key, digest_count, window_started_at,
    created_at, updated_at, read_at, correlation_id)
SELECT r.notification_id, e.tenant_id, r.user_id, r.seq, e.file_id, e.version, e.event_type,
       e.event_id, e.actor_user_id, e.file_name, e.summary, e.dedupe_key, 1,
       e.window_started_at, CAST(:now AS timestamp), CAST(:now AS timestamp), NULL,
       e.correlation_id
FROM unnest(CAST(:ids AS varchar[]), CAST(:users AS varchar[]), CAST(:seqs AS bigint[]),
            CAST(:events AS bigint[])) AS r(notification_id, user_id, seq, ev)
JOIN unnest(CAST(:e_tenant AS varchar[]), CAST(:e_file AS varchar[]),
            CAST(:e_version AS bigint[]), CAST(:e_type AS varchar[]),
            CAST(:e_id AS varchar[]), CAST(:e_actor AS varchar[]),
            CAST(:e_name AS varchar[]), CAST(:e_summary AS varchar[]),
            CAST(:e_dedupe AS varchar[]), CAST(:e_window AS timestamp[]),
            CAST(:e_correlation AS varchar[]))
     WITH ORDINALITY AS e(tenant_id, file_id, version, event_type, event_id, actor_user_id,
                          file_name, summary, dedupe_key, window_started_at, correlation_id,
                          ev)
  ON e.ev = r.ev
ON CONFLICT DO NOTHING
RETURNING notification_id
"""
)


def batchable(session: AsyncSession, described: list[Description]) -> bool:
    """Whether a chain may take this path: PostgreSQL, and no event of it can fold."""
    return session.get_bind().dialect.name == "postgresql" and not any(
        d.digestible for d in described
    )


async def fan_out_chain(
    session: AsyncSession,
    chain: list[events_pb2.Event],
    described: list[Description],
    occurred_at: list[datetime],
    now: datetime,
) -> tuple[list[Written], int]:
    """Write one notification per audience user of every event in `chain` (version order).

    Returns what was written (for live delivery after commit) and how many rows the
    UNIQUE constraint refused (already written: counted as duplicates prevented)."""
    # (tenant, user) -> indexes into `chain` of the events that notify them, in order.
    recipients: defaultdict[tuple[str, str], list[int]] = defaultdict(list)
    for i, ev in enumerate(chain):
        for user in audience(ev):
            recipients[(ev.tenant_id, user)].append(i)
    if not recipients:
        return [], 0
    keys = sorted(recipients)
    taken = await session.execute(
        _TAKE_SEQS,
        {
            "tenants": [t for t, _ in keys],
            "users": [u for _, u in keys],
            "counts": [len(recipients[k]) for k in keys],
        },
    )
    states = [
        {
            "tenant_id": ev.tenant_id,
            "file_id": d.file_id,
            "version": ev.version,
            "event_type": ev.event_type,
            "event_id": ev.event_id,
            "actor_user_id": ev.actor_user_id,
            "file_name": d.file_name,
            "summary": d.summary,
            "dedupe_key": ev.dedupe_key,
            "digest_count": 1,
            "window_started_at": occurred_at[i],
            "created_at": now,
            "updated_at": now,
            "read_at": None,
            "correlation_id": ev.correlation_id,
        }
        for i, (ev, d) in enumerate(zip(chain, described, strict=True))
    ]
    rows: list[dict[str, object]] = []
    for tenant_id, user_id, last_seq in taken:
        events = recipients[(tenant_id, user_id)]
        first = last_seq - len(events) + 1
        for offset, i in enumerate(events):
            rows.append(
                {
                    **states[i],
                    "notification_id": uuid.uuid4().hex,
                    "user_id": user_id,
                    "seq": first + offset,
                    "_ev": i + 1,  # WITH ORDINALITY counts from 1
                }
            )
    stored = await session.execute(
        _INSERT,
        {
            "now": now,
            "ids": [r["notification_id"] for r in rows],
            "users": [r["user_id"] for r in rows],
            "seqs": [r["seq"] for r in rows],
            "events": [r.pop("_ev") for r in rows],
            **{param: [s[column] for s in states] for param, column in _EVENT_COLUMNS.items()},
        },
    )
    kept = {nid for (nid,) in stored}
    written = [Written(r, merged=False) for r in rows if r["notification_id"] in kept]
    return written, len(rows) - len(written)


_EVENT_COLUMNS = {
    "e_tenant": "tenant_id",
    "e_file": "file_id",
    "e_version": "version",
    "e_type": "event_type",
    "e_id": "event_id",
    "e_actor": "actor_user_id",
    "e_name": "file_name",
    "e_summary": "summary",
    "e_dedupe": "dedupe_key",
    "e_window": "window_started_at",
    "e_correlation": "correlation_id",
}
