"""On PostgreSQL, tenant, user, file and notification ids compare byte by byte whatever
the server's default collation (migration notify_0006): on a database whose default is
ICU en-US, SQL orders ids as Python's sorted() does, so the stream rows' lock order is one
order, and both fan-out paths write and list notifications on it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest
from notify.harness import event, start_notify
from serentak.notify.v1 import notify_pb2
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from services.common.config import DEFAULT_AUTH_TOKENS
from services.common.db import sync_url
from services.notify import database as notify_db
from services.notify import metrics
from services.notify.settings import NotifySettings

# Upper and lower case, accents and punctuation: en-US and byte order disagree on these.
IDS = ["Zoe", "alice", "Bob", "_ops", "bob", "\u00c9mile", "\u00e9mile", "z9", "Z10", "a-b", "ab"]
OPAQUE = {
    "notifications": {"notification_id", "tenant_id", "user_id", "file_id"},
    "notify_user_streams": {"tenant_id", "user_id"},
}


def test_ids_order_in_sql_as_python_sorts_them_under_a_linguistic_default(postgres) -> None:
    url = postgres.create(icu_locale="en-US")
    engine = create_engine(sync_url(url))
    try:
        with engine.connect() as conn:
            linguistic = conn.execute(
                text("SELECT i FROM unnest(CAST(:ids AS varchar[])) AS i ORDER BY i"),
                {"ids": IDS},
            ).scalars()
            assert list(linguistic) != sorted(IDS)  # the database's own default differs
        notify_db.migrate(url)
        with engine.begin() as conn:
            collations = conn.execute(
                text(
                    "SELECT table_name, column_name, collation_name"
                    " FROM information_schema.columns"
                    " WHERE table_name IN ('notifications', 'notify_user_streams')"
                )
            ).all()
            opaque = {(t, c): coll for t, c, coll in collations if c in OPAQUE.get(t, ())}
            assert len(opaque) == 6 and set(opaque.values()) == {"C"}
            conn.execute(
                text(
                    "INSERT INTO notify_user_streams (tenant_id, user_id, last_seq)"
                    " SELECT 'acme', u, 0 FROM unnest(CAST(:ids AS varchar[])) AS u"
                ),
                {"ids": IDS},
            )
            locked = conn.execute(
                text(
                    "SELECT user_id FROM notify_user_streams ORDER BY tenant_id, user_id FOR UPDATE"
                )
            ).scalars()
            assert list(locked) == sorted(IDS)
    finally:
        engine.dispose()


async def test_both_fan_out_paths_work_on_a_linguistic_default(postgres, tmp_path: Path) -> None:
    url = postgres.create(icu_locale="en-US")
    notify_db.migrate(url)
    users = ["carol", *IDS]
    # Bearer tokens are ASCII header values: user i signs in with tok-i.
    tokens = dict(DEFAULT_AUTH_TOKENS)
    tokens.update({f"tok-{i}": {"tenant_id": "acme", "user_id": u} for i, u in enumerate(IDS)})
    settings = NotifySettings(notify_database_url=url, data_dir=tmp_path, auth_tokens=tokens)
    inline_before = metrics.FANOUT_INLINE_EVENTS._value.get()
    async with start_notify(settings) as notify:
        # Content updates take the one-statement batch; renames the per-event path.
        for version, kind in enumerate(("content", "rename", "content"), start=1):
            resp = await notify.ingest_settled(
                event("f-\u00c9t\u00e9", version, kind=kind, name=f"r{version}", audience=users)
            )
            assert resp.notifications_written == len(IDS)  # carol acts
        assert metrics.FANOUT_INLINE_EVENTS._value.get() - inline_before == 2
        for i in range(len(IDS)):
            md = (("authorization", f"Bearer tok-{i}"),)
            page = await notify.stub.ListNotifications(
                notify_pb2.ListNotificationsRequest(page_size=10), metadata=md
            )
            assert [n.version for n in page.notifications] == [3, 2, 1]
            badge = await notify.stub.GetUnreadCount(
                notify_pb2.GetUnreadCountRequest(), metadata=md
            )
            assert badge.unread_count == 3


async def test_the_batch_fan_out_locks_stream_rows_in_byte_order(postgres, tmp_path: Path) -> None:
    # "B" < "a" in byte order (and Python's sorted()), "a" < "B" in en-US: with "a"'s row
    # held elsewhere, a fan-out that locks in byte order holds "B" while it waits for "a".
    url = postgres.create(icu_locale="en-US")
    notify_db.migrate(url)
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    settings = NotifySettings(notify_database_url=url, data_dir=tmp_path)
    users = ("carol", "B", "a")
    async with start_notify(settings) as notify:
        await notify.ingest_settled(event("f-order", 1, audience=users))  # the stream rows
        async with await psycopg.AsyncConnection.connect(dsn) as holder:
            await holder.execute(_LOCK_STREAM, ("a",))  # held until the rollback below
            ingest = asyncio.create_task(notify.ingest(event("f-order", 2, audience=users)))
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as probe:
                async with asyncio.timeout(DEADLINE_S):
                    while not await _waits_for_a_row_lock(probe):  # noqa: ASYNC110
                        await asyncio.sleep(0.02)  # poll interval of the wait above
                with pytest.raises(psycopg.errors.LockNotAvailable):
                    await probe.execute(_LOCK_STREAM + " NOWAIT", ("B",))
            await holder.rollback()
        resp = await ingest
        assert resp.notifications_written == 2


DEADLINE_S = 30.0
_LOCK_STREAM = (
    "SELECT last_seq FROM notify_user_streams WHERE tenant_id = 'acme' AND user_id = %s FOR UPDATE"
)


async def _waits_for_a_row_lock(conn: psycopg.AsyncConnection) -> bool:
    cur = await conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND query LIKE '%notify_user_streams%'"
    )
    row = await cur.fetchone()
    return row is not None and row[0] > 0
