"""PostgreSQL: NOTIFY every notify replica when a user's stream position moves.

Each notification takes the next `last_seq` of its user's `notify_user_streams` row (a
digest update too), so a row trigger there sees every new stream position. The payload
is `[tenant_id, user_id, last_seq]` as JSON; replicas holding a Subscribe stream of that
user read it from the database after the stream's cursor (`services.notify.streams`).
NOTIFY is transactional: sent at commit, so the rows are visible to whoever it wakes;
dropped on rollback. SQLite has no cross-process notification: one notify replica there.

Revision ID: notify_0003
Revises: notify_0002
Create Date: 2026-12-01
"""

from alembic import op

revision = "notify_0003"
down_revision = "notify_0002"
branch_labels = None
depends_on = None

# The channel is `services.notify.stream_listener.STREAMS_CHANNEL`.
CHANNEL = "serentak_notify_streams"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        f"""
CREATE FUNCTION {CHANNEL}_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}',
                      json_build_array(NEW.tenant_id, NEW.user_id, NEW.last_seq)::text);
    RETURN NULL;
END
$$
"""
    )
    # lock_streams inserts rows at 0 (nothing to read yet); next_seqs inserts at 1 or bumps.
    op.execute(
        "CREATE TRIGGER notify_user_streams_insert_notify AFTER INSERT ON notify_user_streams "
        f"FOR EACH ROW WHEN (NEW.last_seq > 0) EXECUTE FUNCTION {CHANNEL}_notify()"
    )
    op.execute(
        "CREATE TRIGGER notify_user_streams_update_notify "
        "AFTER UPDATE OF last_seq ON notify_user_streams "
        f"FOR EACH ROW WHEN (NEW.last_seq > OLD.last_seq) EXECUTE FUNCTION {CHANNEL}_notify()"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS notify_user_streams_update_notify ON notify_user_streams")
    op.execute("DROP TRIGGER IF EXISTS notify_user_streams_insert_notify ON notify_user_streams")
    op.execute(f"DROP FUNCTION IF EXISTS {CHANNEL}_notify()")
