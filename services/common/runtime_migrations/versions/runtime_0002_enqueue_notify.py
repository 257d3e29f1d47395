"""PostgreSQL: NOTIFY on every commit that enqueues a job or records an outbox event.

Idle workers and relays in other processes LISTEN and claim at once instead of at their
next poll (polling stays as the fallback). A statement-level trigger rather than a
pg_notify call in `enqueue`: no extra round trip per enqueue, and nothing to forget.
NOTIFY is transactional: delivered at commit, dropped on rollback, and identical
payloads within one transaction are folded into one. SQLite has no cross-process
notification: there the runtime relies on in-process wake() and a short poll.

Revision ID: runtime_0002
Revises: runtime_0001
Create Date: 2026-11-30
"""

from alembic import op

revision = "runtime_0002"
down_revision = "runtime_0001"
branch_labels = None
depends_on = None

# (table, channel): the channels are `services.common.jobs.listener`'s.
_NOTIFIED = (("jobs", "serentak_jobs"), ("outbox_events", "serentak_outbox"))


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, channel in _NOTIFIED:
        op.execute(
            f"""
CREATE FUNCTION {channel}_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{channel}', '');
    RETURN NULL;
END
$$
"""
        )
        op.execute(
            f"CREATE TRIGGER {table}_notify AFTER INSERT ON {table} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {channel}_notify()"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, channel in _NOTIFIED:
        op.execute(f"DROP TRIGGER IF EXISTS {table}_notify ON {table}")
        op.execute(f"DROP FUNCTION IF EXISTS {channel}_notify()")
