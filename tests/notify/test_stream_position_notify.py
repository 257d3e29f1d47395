"""PostgreSQL: every moved stream position is NOTIFYed once at commit (migration
notify_0005), a statement's positions in a few payloads under NOTIFY's 8,000-byte limit,
and nothing for rows created at 0 or a transaction that rolled back."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy.engine import make_url

from services.common.jobs.listener import libpq_url
from services.notify.database import migrate
from services.notify.stream_listener import STREAMS_CHANNEL, parse_positions

DONE = "done"  # a marker sent after the statements under test: all before it have arrived
# Ids as long as principals may be (64): the most bytes a position can take.
USERS = [f"{i:04d}".ljust(64, "u") for i in range(1000)]
TENANT = "t".ljust(64, "t")


@pytest.fixture
def conninfo(postgres) -> str:  # type: ignore[no-untyped-def]
    url = postgres.create()
    migrate(url)
    return libpq_url(make_url(url))


def heard(listener: psycopg.Connection, writer: psycopg.Connection) -> Iterator[str]:
    """Payloads on the channel up to the marker the writer sends now."""
    writer.execute("SELECT pg_notify(%s, %s)", (STREAMS_CHANNEL, DONE))
    writer.commit()
    for note in listener.notifies(timeout=30):
        if note.payload == DONE:
            return
        yield note.payload
    raise AssertionError("the marker never arrived")


def upsert(writer: psycopg.Connection, users: list[str], step: int) -> None:
    """One statement moving every user's position by `step` (0: a lock_streams insert)."""
    writer.execute(
        "INSERT INTO notify_user_streams AS s (tenant_id, user_id, last_seq) "
        "SELECT %s, u, %s FROM unnest(CAST(%s AS varchar[])) AS u ORDER BY u "
        "ON CONFLICT (tenant_id, user_id) DO UPDATE SET last_seq = s.last_seq + EXCLUDED.last_seq",
        (TENANT, step, users),
    )


@pytest.mark.postgres
def test_a_statement_moving_1000_positions_notifies_each_once_in_a_few_payloads(conninfo):
    with (
        psycopg.connect(conninfo, autocommit=True) as listener,
        psycopg.connect(conninfo) as writer,
    ):
        listener.execute(f"LISTEN {STREAMS_CHANNEL}")

        upsert(writer, USERS, 0)  # rows created at 0: nothing to read yet
        writer.commit()
        assert list(heard(listener, writer)) == []

        upsert(writer, USERS, 1)  # every position moves to 1
        writer.commit()
        payloads = list(heard(listener, writer))
        assert 1 < len(payloads) < 50
        assert all(len(p.encode()) < 8000 for p in payloads)
        positions = [pos for p in payloads for pos in parse_positions(p) or []]
        assert sorted(positions) == [(TENANT, u, 1) for u in USERS]

        upsert(writer, USERS[:3], 2)  # a rolled-back move is never heard
        writer.rollback()
        upsert(writer, USERS[5:7], 2)
        writer.commit()
        moved = [pos for p in heard(listener, writer) for pos in parse_positions(p) or []]
        assert sorted(moved) == [(TENANT, USERS[5], 3), (TENANT, USERS[6], 3)]
