"""PostgreSQL: stream rows leave 30% of each page free (fillfactor 70).

Every fan-out moves `last_seq` of each recipient's stream row: 1,000 row updates for an
event shared with 1,000 users. An update is HOT (the new row version on the same page, no
new primary-key entry) only when the page has room. 20 fan-outs to 1,000 users: 5,926 of
the 20,000 updates were HOT at the default fillfactor (100), 18,818 at 70
(`tests/notify/test_stream_rows_fillfactor.py`); the 1,000-row position upsert 7.3 -> 6.1
ms (median of 60, alternating). A stream row is ~50 bytes, one per user: the space does
not matter. Pages written from now on keep the room (existing ones as their rows move).

Revision ID: notify_0007
Revises: notify_0006
Create Date: 2026-12-01
"""

from alembic import op

revision = "notify_0007"
down_revision = "notify_0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE notify_user_streams SET (fillfactor = 70)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE notify_user_streams RESET (fillfactor)")
