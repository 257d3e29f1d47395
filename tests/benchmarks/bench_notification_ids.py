# ruff: noqa: E402 - the script puts the repository on sys.path before importing it
"""Notification rows: what their ids cost a 1,000-user fan-out's insert.

    .venv/bin/python tests/benchmarks/bench_notification_ids.py [--quick]
        [--dsn postgresql://...] [--rows N] [--icu-locale en-US]

One fresh PostgreSQL database (with `--icu-locale`, one whose default collation is that
ICU locale's, as on servers initialised with a linguistic locale such as the official
image's en_US.utf8) migrated to notify's head, and three tables of the same columns and
indexes:
- `before`: ids as before this round: random (uuid4) and compared under the database's
  default collation (the baseline);
- `ordered`: time-ordered ids (RFC 9562 v7, `notification_ids.py`), default collation;
- `notifications` itself: time-ordered ids compared byte by byte (COLLATE "C", notify_0006).
Each is filled with the same rows (1,000 users x `--rows` / 1,000 events) and vacuumed.
Then 1,000-row fan-out inserts rotate between them, each table going first in turn (the
same columns and values but the id, drawn in SQL as the fan-out statement does), a
CHECKPOINT every 10 rounds as a busy server would have, each under EXPLAIN (ANALYZE,
BUFFERS, WAL). Prints, per table, the insert's median time, WAL bytes, full-page images
and buffer reads, and each one's ratios to `before`.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import psycopg
from sqlalchemy.engine import make_url
from support.postgres import PostgresDatabases

from services.common.logging import configure_logging
from services.common.migrate import upgrade
from services.notify.database import migration_locations
from services.notify.notification_ids import NOTIFICATION_ID_SQL

DEFAULT_DSN = "postgresql://postgres:serentak@127.0.0.1:5432/postgres"
AUDIENCE = 1000
RANDOM_ID = "replace(CAST(gen_random_uuid() AS varchar), '-', '')"  # uuid4().hex
ORDERED_ID = NOTIFICATION_ID_SQL.replace(":id_ms", "%(id_ms)s")
INSERT = """
INSERT INTO {table} (
    notification_id, tenant_id, user_id, seq, file_id, version, event_type, event_id,
    actor_user_id, file_name, summary, dedupe_key, digest_count, window_started_at,
    created_at, updated_at, read_at, correlation_id)
SELECT {id}, 'acme', 'user-' || lpad(CAST(u AS text), 6, '0'), e, 'file-' || mod(e, 50), e,
       'file.content.updated', 'ev-' || e, 'carol', 'report.pdf',
       'carol updated report.pdf', 'file:' || mod(e, 50) || ':content', 1, now(), now(),
       now(), NULL, 'bench'
FROM generate_series(CAST(%(first)s AS bigint), CAST(%(last)s AS bigint)) AS e,
     generate_series(1, {audience}) AS u
"""
# table -> (how its ids are drawn, its id columns' collation: None = the default)
ARMS = {
    "before": (RANDOM_ID, None),
    "ordered": (ORDERED_ID, None),
    "notifications": (ORDERED_ID, "C"),
}
OPAQUE = (("notification_id", 32), ("tenant_id", 128), ("user_id", 128), ("file_id", 128))
# Loaded rows were drawn a while ago: their ids carry older milliseconds.
LOAD_MS = 1_700_000_000_000


def explain(conn: psycopg.Connection, table: str, id_sql: str, event: int, id_ms: int) -> dict:
    plan = conn.execute(
        "EXPLAIN (ANALYZE, BUFFERS, WAL, TIMING OFF, COSTS OFF) "
        + INSERT.format(table=table, id=id_sql, audience=AUDIENCE),
        {"first": event, "last": event, "id_ms": id_ms},
    ).fetchall()
    whole = "\n".join(row[0] for row in plan)
    insert = whole.split("Planning")[0]  # the insert's own counters, not planning's

    def field(name: str) -> int:
        found = re.search(rf"\b{name}=(\d+)", insert)
        return int(found.group(1)) if found else 0  # EXPLAIN leaves out zero counters

    took = re.search(r"Execution Time: ([\d.]+)", whole)
    assert took is not None, whole
    return {
        "ms": float(took[1]),
        "wal": field("bytes"),
        "fpi": field("fpi"),
        "reads": field("read"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="100,000 rows loaded, 20 rounds")
    parser.add_argument("--dsn", default=os.environ.get("SERENTAK_TEST_PG_DSN", DEFAULT_DSN))
    parser.add_argument("--rows", type=int, help="rows loaded first (default 1,000,000)")
    parser.add_argument("--icu-locale", help="the database's default collation (e.g. en-US)")
    args = parser.parse_args()
    rows = args.rows or (100_000 if args.quick else 1_000_000)
    rounds = 20 if args.quick else 40
    configure_logging("bench_notification_ids", "console", "WARNING")
    databases = PostgresDatabases(args.dsn)
    try:
        url = databases.create(icu_locale=args.icu_locale)
        upgrade(url, migration_locations())
        dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(dsn, autocommit=True) as conn:
            default = conn.execute(
                "SELECT datcollate FROM pg_database WHERE datname = current_database()"
            )
            collation = args.icu_locale or default.fetchone()[0]  # type: ignore[index]
            for table, (_, coll) in ARMS.items():
                if coll is None:
                    conn.execute(f"CREATE TABLE {table} (LIKE notifications INCLUDING ALL)")
                    for column, length in OPAQUE:
                        # Without COLLATE, the type's default: the database's collation.
                        conn.execute(
                            f"ALTER TABLE {table} ALTER COLUMN {column} TYPE varchar({length})"
                        )
            loaded = rows // AUDIENCE
            for table, (id_sql, _) in ARMS.items():
                # Loaded rows carry older clock values, one millisecond per event.
                conn.execute(
                    INSERT.format(
                        table=table,
                        id=id_sql.replace("%(id_ms)s", f"{LOAD_MS} + e"),
                        audience=AUDIENCE,
                    ),
                    {"first": 1, "last": loaded},
                )
                conn.execute(f"VACUUM ANALYZE {table}")
            conn.execute("CHECKPOINT")
            runs: dict[str, list[dict]] = {table: [] for table in ARMS}
            tables = list(ARMS)
            for i in range(rounds):
                event = loaded + 1 + i
                turn = tables[i % 3 :] + tables[: i % 3]  # each table goes first in turn
                for table in turn:
                    id_sql = ARMS[table][0]
                    runs[table].append(explain(conn, table, id_sql, event, LOAD_MS + 10**6 + i))
                if i % 10 == 9:
                    conn.execute("CHECKPOINT")
    finally:
        databases.drop_all()
    print(
        f"notification rows: {rounds} inserts of {AUDIENCE} rows per table into {rows:,}, "
        f"PostgreSQL, default collation {collation}"
    )
    medians = {
        table: {k: statistics.median(r[k] for r in results) for k in ("ms", "wal", "fpi", "reads")}
        for table, results in runs.items()
    }
    base = medians["before"]
    for table, m in medians.items():
        print(
            f"{table:<14} median {m['ms']:6.1f} ms (x{m['ms'] / base['ms']:.2f})  "
            f"WAL {m['wal'] / 1e6:5.2f} MB (x{m['wal'] / max(1, base['wal']):.2f})  "
            f"full-page images {m['fpi']:5.0f}  buffer reads {m['reads']:5.0f}"
        )


if __name__ == "__main__":
    main()
