# ruff: noqa: E402 - the script puts the repository on sys.path before importing it
"""Notification ids: time-ordered (RFC 9562 v7, what the fan-out draws) vs random (v4).

    .venv/bin/python tests/benchmarks/bench_notification_ids.py [--quick] [--dsn postgresql://...]

One fresh PostgreSQL database migrated to notify's head holds `notifications` and a copy
of it (`LIKE ... INCLUDING ALL`: the same columns and indexes). Both are filled with the
same rows (1,000 users x `--rows` / 1,000 events), random ids in the copy, time-ordered
ids in the real table, then vacuumed. Then 1,000-row fan-out inserts alternate between
the two, each going first every other round (the same columns and values but the id,
drawn in SQL as the fan-out statement does), a CHECKPOINT every 10 inserts as a busy
server would have, each under EXPLAIN (ANALYZE, BUFFERS, WAL). Prints, per arm, the
insert's median time, WAL bytes, full-page images and buffer reads, and the ratios
(random = the baseline).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "gen")]

import psycopg
from sqlalchemy.engine import make_url

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
ARMS = {
    "random (v4)": ("notifications_random", RANDOM_ID),
    "ordered (v7)": ("notifications", ORDERED_ID),
}
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
    parser.add_argument("--quick", action="store_true", help="100,000 rows loaded, 20 inserts")
    parser.add_argument("--dsn", default=os.environ.get("SERENTAK_TEST_PG_DSN", DEFAULT_DSN))
    parser.add_argument("--rows", type=int, help="rows loaded first (default 1,000,000)")
    args = parser.parse_args()
    rows = args.rows or (100_000 if args.quick else 1_000_000)
    inserts = 20 if args.quick else 40
    configure_logging("bench_notification_ids", "console", "WARNING")
    name = f"serentak_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = make_url(args.dsn).set(drivername="postgresql+psycopg", database=name)
        upgrade(url.render_as_string(hide_password=False), migration_locations())
        dsn = make_url(args.dsn).set(database=name).render_as_string(hide_password=False)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE notifications_random (LIKE notifications INCLUDING ALL)")
            loaded = rows // AUDIENCE
            for table, id_sql in ARMS.values():
                # Loaded rows take the ordered arm's older clock value, one millisecond
                # per event (the random arm ignores it).
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
            runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
            for i in range(inserts):
                event = loaded + 1 + i
                order = list(ARMS.items())  # each arm goes first every other round
                for arm, (table, id_sql) in order if i % 2 else order[::-1]:
                    runs[arm].append(explain(conn, table, id_sql, event, LOAD_MS + 10**6 + i))
                if i % 10 == 9:
                    conn.execute("CHECKPOINT")
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(f"notification ids: {inserts} inserts of {AUDIENCE} rows into {rows:,} (PostgreSQL)")
    medians = {
        arm: {k: statistics.median(r[k] for r in results) for k in ("ms", "wal", "fpi", "reads")}
        for arm, results in runs.items()
    }
    for arm, m in medians.items():
        print(
            f"{arm:<14} median {m['ms']:6.1f} ms  WAL {m['wal'] / 1e6:5.2f} MB  "
            f"full-page images {m['fpi']:5.0f}  buffer reads {m['reads']:5.0f}"
        )
    base, new = medians["random (v4)"], medians["ordered (v7)"]
    print(
        f"ordered / random: time x{new['ms'] / base['ms']:.2f}, "
        f"WAL x{new['wal'] / max(1, base['wal']):.2f}, "
        f"full-page images x{new['fpi'] / max(1, base['fpi']):.2f}"
    )


if __name__ == "__main__":
    main()
