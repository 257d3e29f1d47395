"""Jobs behind their partition's head wait as 'waiting', so claims never scan them.

A partition runs one job at a time. The claim looked at every queued, due job in id order
and threw away those with an earlier job in their partition, so a partition thousands
deep whose head was running made every claim, of any partition, walk all of it
(bench_job_claims: 5,000 deep, PostgreSQL, 4.4 -> 111 ms a claim). Now:

- `queue.enqueue` stores a job as 'waiting' when its partition already has a job;
- deleting a partition's head (completion, dead letter) promotes the next job of its
  partition to 'queued', in the same statement (these triggers), and on PostgreSQL
  wakes idle workers of other processes at commit, as an enqueue does (runtime_0002);
- the claim scans the new partial index `ix_jobs_claimable` (queued and running jobs:
  partition heads) oldest first, and still checks that each job is its partition's
  first, so 'waiting' only prunes the scan: order never depends on it;
- a job whose enqueue raced with its predecessor's deletion (PostgreSQL: the enqueue saw
  the head, the deletion's promotion did not see the uncommitted new job) is left
  'waiting' at the head; the worker's periodic `sql.PROMOTE_STRANDED` promotes it.

Existing queued jobs with an earlier job in their partition become 'waiting' here.

Revision ID: runtime_0003
Revises: runtime_0002
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "runtime_0003"
down_revision = "runtime_0002"
branch_labels = None
depends_on = None

CLAIMABLE = "status IN ('queued', 'running')"

# The channel is `services.common.jobs.listener.JOBS_CHANNEL`.
CHANNEL = "serentak_jobs"

# One promotion per statement over its deleted rows (a batch completion deletes up to
# 128 jobs); each partition's next job by the (partition_key, id) index.
POSTGRESQL_FUNCTION = f"""
CREATE FUNCTION serentak_jobs_promote() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE jobs SET status = 'queued'
    WHERE status = 'waiting'
      AND id IN (SELECT (SELECT min(j.id) FROM jobs AS j
                         WHERE j.partition_key = freed.partition_key)
                 FROM (SELECT DISTINCT partition_key FROM gone) AS freed);
    IF FOUND THEN
        PERFORM pg_notify('{CHANNEL}', '');
    END IF;
    RETURN NULL;
END
$$
"""

SQLITE_TRIGGER = """
CREATE TRIGGER jobs_promote AFTER DELETE ON jobs
BEGIN
    UPDATE jobs SET status = 'queued'
    WHERE status = 'waiting'
      AND id = (SELECT min(j.id) FROM jobs AS j WHERE j.partition_key = OLD.partition_key);
END
"""

MARK_WAITING = """
UPDATE jobs SET status = 'waiting'
WHERE status = 'queued'
  AND EXISTS (SELECT 1 FROM jobs AS earlier
              WHERE earlier.partition_key = jobs.partition_key AND earlier.id < jobs.id)
"""


def upgrade() -> None:
    op.create_index(
        "ix_jobs_claimable",
        "jobs",
        ["id"],
        postgresql_where=sa.text(CLAIMABLE),
        sqlite_where=sa.text(CLAIMABLE),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(POSTGRESQL_FUNCTION)
        op.execute(
            "CREATE TRIGGER jobs_promote AFTER DELETE ON jobs REFERENCING OLD TABLE AS gone "
            "FOR EACH STATEMENT EXECUTE FUNCTION serentak_jobs_promote()"
        )
    else:
        op.execute(SQLITE_TRIGGER)
    op.execute(MARK_WAITING)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS jobs_promote" + _on_jobs())
    op.drop_index("ix_jobs_claimable", table_name="jobs")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS serentak_jobs_promote()")
    op.execute("UPDATE jobs SET status = 'queued' WHERE status = 'waiting'")


def _on_jobs() -> str:
    return " ON jobs" if op.get_bind().dialect.name == "postgresql" else ""
