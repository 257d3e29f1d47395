"""PostgreSQL: NOTIFY stream positions once per statement, not once per row.

notify_0003's row triggers ran a PL/pgSQL call and a `pg_notify` for every user a fan-out
touched: 1,000 of each for an event shared with 1,000 users (2 ms of the statement), and
1,000 notifications for every listening replica to parse. Statement triggers over the
transition tables send the same positions as JSON lists of `[tenant_id, user_id,
last_seq]`, cut below NOTIFY's 8,000-byte payload limit: a handful of notifications per
fan-out. Which positions are sent is unchanged: a row inserted above 0, a row whose
`last_seq` grew. Listeners read both payload forms (`stream_listener.parse_positions`).

Revision ID: notify_0005
Revises: notify_0004
Create Date: 2026-12-01
"""

from alembic import op

revision = "notify_0005"
down_revision = "notify_0004"
branch_labels = None
depends_on = None

# The channel is `services.notify.stream_listener.STREAMS_CHANNEL`.
CHANNEL = "serentak_notify_streams"
# Bytes of positions per NOTIFY: below the 8,000-byte limit with room for one more entry
# (tenant and user ids are at most 64 characters, up to 4 bytes each in UTF-8).
CHUNK_BYTES = 7000


def _function(name: str, moved: str) -> str:
    """A trigger function NOTIFYing the positions `moved` (a query over the transition
    tables) selects as `item` (a JSON text), in chunks of at most CHUNK_BYTES."""
    return f"""
CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}', '[' || string_agg(item, ',') || ']')
    FROM (
        SELECT item, sum(octet_length(item) + 1) OVER (ORDER BY item) / {CHUNK_BYTES} AS part
        FROM ({moved}) AS moved
    ) AS parts
    GROUP BY part;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS notify_user_streams_update_notify ON notify_user_streams")
    op.execute("DROP TRIGGER IF EXISTS notify_user_streams_insert_notify ON notify_user_streams")
    op.execute(
        _function(
            f"{CHANNEL}_inserted",
            "SELECT json_build_array(n.tenant_id, n.user_id, n.last_seq)::text AS item "
            "FROM new_rows AS n WHERE n.last_seq > 0",
        )
    )
    op.execute(
        _function(
            f"{CHANNEL}_updated",
            "SELECT json_build_array(n.tenant_id, n.user_id, n.last_seq)::text AS item "
            "FROM new_rows AS n JOIN old_rows AS o "
            "ON o.tenant_id = n.tenant_id AND o.user_id = n.user_id "
            "WHERE n.last_seq > o.last_seq",
        )
    )
    # lock_streams inserts rows at 0 (nothing to read yet); a fan-out inserts at 1+ or bumps.
    op.execute(
        "CREATE TRIGGER notify_user_streams_inserted AFTER INSERT ON notify_user_streams "
        "REFERENCING NEW TABLE AS new_rows "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {CHANNEL}_inserted()"
    )
    op.execute(
        "CREATE TRIGGER notify_user_streams_updated AFTER UPDATE ON notify_user_streams "
        "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {CHANNEL}_updated()"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS notify_user_streams_updated ON notify_user_streams")
    op.execute("DROP TRIGGER IF EXISTS notify_user_streams_inserted ON notify_user_streams")
    op.execute(f"DROP FUNCTION IF EXISTS {CHANNEL}_updated()")
    op.execute(f"DROP FUNCTION IF EXISTS {CHANNEL}_inserted()")
    # notify_0003's row triggers (its function is still there).
    op.execute(
        "CREATE TRIGGER notify_user_streams_insert_notify AFTER INSERT ON notify_user_streams "
        f"FOR EACH ROW WHEN (NEW.last_seq > 0) EXECUTE FUNCTION {CHANNEL}_notify()"
    )
    op.execute(
        "CREATE TRIGGER notify_user_streams_update_notify "
        "AFTER UPDATE OF last_seq ON notify_user_streams "
        f"FOR EACH ROW WHEN (NEW.last_seq > OLD.last_seq) EXECUTE FUNCTION {CHANNEL}_notify()"
    )
