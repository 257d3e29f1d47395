"""PostgreSQL fan-out fast path: a whole chain of events in one statement.

`fanout.fan_out` writes one event at a time with multi-row statements whose text grows
with the audience (SQLAlchemy's "insertmanyvalues": 400 rows x 15 columns of parameters a
statement, which psycopg re-parses every time; that parse was most of a fan-out's CPU).
Here the chain's audiences travel as one JSON document (a list of user ids per event:
the json module encodes it in C, where psycopg dumps lists element by element in Python)
and the per-event state as arrays (`unnest`), so the statement text is constant (parsed
and planned once per connection) and its size does not depend on N. The statement does
the per-recipient work itself (spreading the audiences into rows, numbering each user's
positions, drawing the notification ids) and returns what it stored as one JSON
document, so Python touches each recipient once, not four times. One data-modifying CTE
does the writes, one round trip instead of three (the round trips between them, not the
statements, were most of a fan-out's latency):

1. one upsert takes every (tenant, user)'s stream positions for the whole chain: a user
   notified by k events of the chain gets `last_seq + 1 .. last_seq + k`, one per event in
   version order. Rows are visited in (tenant, user) order, the global lock order of
   `fanout.lock_streams`, so chains sharing users cannot deadlock;
2. an INSERT ... SELECT writes every notification of the chain: each (event, user) pair
   joined to the position the upsert returned (seq = new last_seq - k_total + rank of
   the event among the user's events of the chain) and to the per-event arrays (the
   state every recipient shares), so an event's text is bound once, not once per
   recipient. Ids are time-ordered UUIDs (`notification_ids.py`, drawn from
   `gen_random_uuid()`, PostgreSQL 13+), as on the per-event path. ON CONFLICT DO
   NOTHING keeps UNIQUE (tenant, user, file, version) as the backstop of exactly-once,
   as on the slow path;
3. the chain's inbox rows go `applied -> notified` (locked by the job's read of them);
4. Ingest's inline fan-out only: the files' applied versions move (rows it has locked).

Only for chains of events that never fold into a digest (content updates, deletes, shares
...): a fold must look at each user's latest notification between events, which the
per-event path (`fanout.fan_out`) does. SQLite always takes that path.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from datetime import datetime
from typing import Any

from serentak.events.v1 import events_pb2
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.driver_sql import DriverStatement
from services.notify.fanout import EventTemplate, Written, audience, new_notification_state
from services.notify.models import InboxStatus
from services.notify.notification_ids import NOTIFICATION_ID_SQL, now_ms
from services.notify.summaries import Description

# Public: bench_notify's durable floor runs the same statement.
FAN_OUT = DriverStatement(
    text(
        """
WITH pairs AS (
    SELECT a.ev, e.tenant_id, u.user_id
    FROM json_array_elements(CAST(:audiences AS json)) WITH ORDINALITY AS a(users, ev)
    JOIN unnest(CAST(:e_tenant AS varchar[])) WITH ORDINALITY AS e(tenant_id, ev)
      ON e.ev = a.ev
    CROSS JOIN LATERAL json_array_elements_text(a.users) AS u(user_id)
),
taken AS (
    INSERT INTO notify_user_streams AS s (tenant_id, user_id, last_seq)
    SELECT tenant_id, user_id, count(*)
    FROM pairs
    GROUP BY tenant_id, user_id
    -- Byte order, as the stream rows' columns and Python's sorted() (notify_0006): the
    -- ids come from JSON, under the database's default collation.
    ORDER BY tenant_id COLLATE "C", user_id COLLATE "C"
    ON CONFLICT (tenant_id, user_id) DO UPDATE SET last_seq = s.last_seq + EXCLUDED.last_seq
    RETURNING s.tenant_id, s.user_id, s.last_seq
),
rows AS (
    SELECT p.ev, p.tenant_id, p.user_id,
           t.last_seq - count(*) OVER mine + row_number() OVER (mine ORDER BY p.ev) AS seq
    FROM pairs AS p
    JOIN taken AS t ON t.tenant_id = p.tenant_id AND t.user_id = p.user_id
    WINDOW mine AS (PARTITION BY p.tenant_id, p.user_id)
),
stored AS (
    INSERT INTO notifications (
        notification_id, tenant_id, user_id, seq, file_id, version, event_type, event_id,
        actor_user_id, file_name, summary, dedupe_key, digest_count, window_started_at,
        created_at, updated_at, read_at, correlation_id)
    SELECT """
        + NOTIFICATION_ID_SQL
        + """, r.tenant_id, r.user_id, r.seq,
           e.file_id, e.version, e.event_type, e.event_id, e.actor_user_id, e.file_name,
           e.summary, e.dedupe_key, 1, e.window_started_at,
           CAST(:now AS timestamp), CAST(:now AS timestamp), NULL, e.correlation_id
    FROM rows AS r
    JOIN unnest(CAST(:e_file AS varchar[]), CAST(:e_version AS bigint[]),
                CAST(:e_type AS varchar[]), CAST(:e_id AS varchar[]),
                CAST(:e_actor AS varchar[]), CAST(:e_name AS varchar[]),
                CAST(:e_summary AS varchar[]), CAST(:e_dedupe AS varchar[]),
                CAST(:e_window AS timestamp[]), CAST(:e_correlation AS varchar[]))
         WITH ORDINALITY AS e(file_id, version, event_type, event_id, actor_user_id,
                              file_name, summary, dedupe_key, window_started_at,
                              correlation_id, ev)
      ON e.ev = r.ev
    ON CONFLICT DO NOTHING
    RETURNING notification_id, tenant_id, user_id, seq, event_id
),
marked AS (
    UPDATE notify_inbox SET status = :notified
    WHERE event_id = ANY(CAST(:e_id AS varchar[]))
),
bumped AS (
    UPDATE notify_aggregate_versions AS a SET applied_version = b.version
    FROM unnest(CAST(:b_ids AS varchar[]), CAST(:b_versions AS bigint[])) AS b(id, version)
    WHERE a.aggregate_id = b.id
),
live AS (
    SELECT l.pair ->> 0 AS tenant_id, l.pair ->> 1 AS user_id
    FROM json_array_elements(CAST(:live AS json)) AS l(pair)
)
SELECT count(*),
       CAST(json_agg(json_build_array(s.notification_id, s.tenant_id, s.user_id, s.seq,
                                      s.event_id)
                     ORDER BY s.tenant_id, s.user_id, s.seq)
            FILTER (WHERE l.user_id IS NOT NULL) AS text)
FROM stored AS s
LEFT JOIN live AS l ON l.tenant_id = s.tenant_id AND l.user_id = s.user_id
"""
    )
)


_MARK = text(
    f"""
WITH bumped AS (
    UPDATE notify_aggregate_versions AS a SET applied_version = b.version
    FROM unnest(CAST(:b_ids AS varchar[]), CAST(:b_versions AS bigint[])) AS b(id, version)
    WHERE a.aggregate_id = b.id
)
UPDATE notify_inbox SET status = '{InboxStatus.NOTIFIED}'
WHERE event_id = ANY(CAST(:ids AS varchar[]))
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
    live: Collection[tuple[str, str]],
    applied: dict[str, int] | None = None,
) -> tuple[list[Written], int, int]:
    """Write one notification per audience user of every event in `chain` (version order).

    `applied` (aggregate id -> version) moves those aggregates' applied versions in the
    same statement (Ingest's inline fan-out: one round trip fewer); their rows must be
    locked by this transaction already.

    Returns what was written for the `live` (tenant, user)s, those with a stream open in
    this process (to hand to their streams after commit; a stream opened since reads its
    notifications from the database on this commit's NOTIFY), how many notifications were
    written in all, and how many rows the UNIQUE constraint refused (already written:
    counted as duplicates prevented)."""
    bumps: dict[str, list[Any]] = {
        "b_ids": list(applied or {}),
        "b_versions": list((applied or {}).values()),
    }
    audiences = [audience(ev) for ev in chain]
    recipients = sum(len(users) for users in audiences)
    if not recipients:
        await session.execute(_MARK, {"ids": [ev.event_id for ev in chain], **bumps})
        return [], 0, 0
    states = [
        new_notification_state(ev, d, at, now)
        for ev, d, at in zip(chain, described, occurred_at, strict=True)
    ]
    # What was stored for live users, in stream order (tenant, user, seq), as one JSON
    # document: parsed in C instead of a result row per notification, and none for the
    # users nobody is watching here (most of a large audience).
    stored, live_rows = await FAN_OUT.one(
        session, fan_out_parameters(audiences, states, now, live, bumps)
    )
    templates = {state["event_id"]: EventTemplate(state) for state in states}
    written = [
        Written(
            {"notification_id": nid, "tenant_id": tenant, "user_id": user, "seq": seq},
            merged=False,
            template=templates[event_id],
        )
        for nid, tenant, user, seq, event_id in json.loads(live_rows or "[]")
    ]
    return written, stored, recipients - stored


def fan_out_parameters(
    audiences: list[list[str]],
    states: list[dict[str, Any]],
    now: datetime,
    live: Collection[tuple[str, str]],
    bumps: dict[str, list[Any]],
) -> dict[str, Any]:
    """The one-statement fan-out's parameters for a chain: its audiences, the events'
    `new_notification_state`s, the live (tenant, user)s and the aggregates to bump."""
    return {
        # One JSON document of the chain's audiences (the json module encodes it in C;
        # psycopg dumps a list element by element); the statement spreads it into rows,
        # numbers each user's positions and draws the ids itself.
        "audiences": json.dumps(audiences, separators=(",", ":")),
        "live": json.dumps(list(live), separators=(",", ":")),
        "now": now,
        "id_ms": now_ms(),
        "notified": InboxStatus.NOTIFIED,
        **bumps,
        **{param: [s[column] for s in states] for param, column in _EVENT_COLUMNS.items()},
    }


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
