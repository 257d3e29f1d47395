"""PostgreSQL: NOTIFY stream positions once per statement, not once per row.

notify_0003's row triggers ran a PL/pgSQL call and a `pg_notify` for every user a fan-out
touched: 1,000 of each for an event shared with 1,000 users, and 1,000 notifications for
every listening replica's event loop to take in right when it delivers that event. A
statement trigger over the transition table sends the same positions as JSON lists of
`[tenant_id, user_id, last_seq]`, cut below NOTIFY's 8,000-byte payload limit: a handful
of notifications per fan-out. Listeners read both payload forms
(`stream_listener.parse_positions`).

Sent: the rows a statement inserted above 0 (lock_streams inserts at 0: nothing to read
yet) or updated. Every update in this service moves a position forward; one that did not
would cost a stream one read that finds nothing new (notify_0003 filtered it out, but
comparing the old and new transition tables made the trigger 20 times slower: they have no
statistics, and the planner joined them in a nested loop).

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
# Bytes of positions per NOTIFY: below the 8,000-byte limit with room for one more entry.
CHUNK_BYTES = 7000

# The running byte count follows the transition table's own order (ROWS frame, no ORDER
# BY): no sort, and each part is at most CHUNK_BYTES plus one entry.
FUNCTION = f"""
CREATE FUNCTION {CHANNEL}_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}', '[' || string_agg(item, ',') || ']')
    FROM (
        SELECT item,
               sum(octet_length(item) + 1) OVER (ROWS UNBOUNDED PRECEDING) / {CHUNK_BYTES}
                   AS part
        FROM (
            SELECT json_build_array(n.tenant_id, n.user_id, n.last_seq)::text AS item
            FROM new_rows AS n
            WHERE n.last_seq > 0
        ) AS moved
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
    op.execute(FUNCTION)
    for event in ("INSERT", "UPDATE"):
        op.execute(
            f"CREATE TRIGGER notify_user_streams_{event.lower()}_moved AFTER {event} "
            "ON notify_user_streams REFERENCING NEW TABLE AS new_rows "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {CHANNEL}_moved()"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS notify_user_streams_update_moved ON notify_user_streams")
    op.execute("DROP TRIGGER IF EXISTS notify_user_streams_insert_moved ON notify_user_streams")
    op.execute(f"DROP FUNCTION IF EXISTS {CHANNEL}_moved()")
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
