"""On PostgreSQL, moving a stream position is mostly a HOT update (migration notify_0007):
the stream rows' pages keep room for the new row version, so a fan-out's 1,000 position
updates add few primary-key entries. Measured against a copy of the table at the default
fillfactor under the same workload, interleaved: page pruning can be skipped when another
process holds a page (a checkpoint, autovacuum), which moves both tables alike."""

from __future__ import annotations

from sqlalchemy import create_engine, text

from services.common.db import sync_url
from services.notify import database as notify_db

USERS = 1000
FAN_OUTS = 20
DEFAULT_FILL = "streams_default_fill"  # LIKE copies columns and indexes, not fillfactor
# The fan-out's position upsert (fanout_batch.FAN_OUT, `taken`), one position per user.
MOVE = """
INSERT INTO {table} AS s (tenant_id, user_id, last_seq)
SELECT 'acme', 'user-' || lpad(CAST(u AS text), 6, '0'), 1
FROM generate_series(1, :users) AS u
ORDER BY 1, 2
ON CONFLICT (tenant_id, user_id) DO UPDATE SET last_seq = s.last_seq + EXCLUDED.last_seq
"""


def test_position_updates_stay_on_their_page(postgres) -> None:
    url = postgres.create()
    notify_db.migrate(url)
    engine = create_engine(sync_url(url))
    tables = ("notify_user_streams", DEFAULT_FILL)
    try:
        with engine.connect() as conn:
            conn.execute(
                text(f"CREATE TABLE {DEFAULT_FILL} (LIKE notify_user_streams INCLUDING ALL)")
            )
            options = conn.execute(
                text(
                    "SELECT relname, reloptions FROM pg_class"
                    " WHERE relname IN ('notify_user_streams', :copy)"
                ),
                {"copy": DEFAULT_FILL},
            ).all()
            assert dict(options) == {"notify_user_streams": ["fillfactor=70"], DEFAULT_FILL: None}
            conn.commit()
            for _ in range(FAN_OUTS + 1):  # the first round inserts the rows
                for table in tables:
                    with conn.begin():
                        conn.execute(text(MOVE.format(table=table)), {"users": USERS})
            conn.execute(text("SELECT pg_stat_force_next_flush()"))
            conn.commit()
            stats = {
                name: (updated, hot)
                for name, updated, hot in conn.execute(
                    text(
                        "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                        " WHERE relname IN ('notify_user_streams', :copy)"
                    ),
                    {"copy": DEFAULT_FILL},
                )
            }
        updated, hot = stats["notify_user_streams"]
        default_updated, default_hot = stats[DEFAULT_FILL]
        assert updated == default_updated == USERS * FAN_OUTS
        # Seen here: 84-94% HOT at fillfactor 70, 30% at the default (100).
        assert hot >= 0.6 * updated, f"{hot} of {updated} updates were HOT"
        assert hot - default_hot >= 0.3 * updated, (hot, default_hot)
    finally:
        engine.dispose()
