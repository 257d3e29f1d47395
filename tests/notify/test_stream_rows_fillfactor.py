"""On PostgreSQL, moving a stream position is a HOT update (migration notify_0007): the
stream rows' pages keep room for the new row version, so a fan-out's 1,000 position
updates add no primary-key entries."""

from __future__ import annotations

from sqlalchemy import create_engine, text

from services.common.db import sync_url
from services.notify import database as notify_db

USERS = 1000
FAN_OUTS = 20
# The fan-out's position upsert (fanout_batch._FAN_OUT, `taken`), one position per user.
MOVE = text(
    """
INSERT INTO notify_user_streams AS s (tenant_id, user_id, last_seq)
SELECT 'acme', 'user-' || lpad(CAST(u AS text), 6, '0'), 1
FROM generate_series(1, :users) AS u
ORDER BY 1, 2
ON CONFLICT (tenant_id, user_id) DO UPDATE SET last_seq = s.last_seq + EXCLUDED.last_seq
"""
)


def test_position_updates_stay_on_their_page(postgres) -> None:
    url = postgres.create()
    notify_db.migrate(url)
    engine = create_engine(sync_url(url))
    try:
        with engine.connect() as conn:
            options = conn.execute(
                text("SELECT reloptions FROM pg_class WHERE relname = 'notify_user_streams'")
            ).scalar()
            assert options == ["fillfactor=70"]
            conn.commit()
            for _ in range(FAN_OUTS + 1):  # the first one inserts the rows
                with conn.begin():
                    conn.execute(MOVE, {"users": USERS})
            conn.execute(text("SELECT pg_stat_force_next_flush()"))
            conn.commit()
            updated, hot = conn.execute(
                text(
                    "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                    " WHERE relname = 'notify_user_streams'"
                )
            ).one()
        assert updated == USERS * FAN_OUTS
        # 94% here; 30% at the default fillfactor (100).
        assert hot >= 0.9 * updated, f"{hot} of {updated} updates were HOT"
    finally:
        engine.dispose()
