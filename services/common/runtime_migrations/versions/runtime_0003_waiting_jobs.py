"""Jobs two or more behind their partition's head are 'waiting': claims never scan them.

A partition runs one job at a time. The claim looked at every queued, due job in id order
and threw away those with an earlier job in their partition, so a partition thousands
deep whose head was running made every claim, of any partition, walk all of it
(bench_job_claims, 20,000 deep: 3.9 -> 409 ms a claim on PostgreSQL, whose plan probed
each queued job with a primary-key scan of the whole partition; 3.7 -> 26 ms on SQLite).
Now:

- `queue.enqueue` stores a job as 'waiting' when its partition already has two jobs or
  more (the head and the next stay 'queued': see below);
- deleting a partition's head (completion, dead letter) promotes the partition's next
  job to 'queued' if it was waiting, in the same statement (these triggers), and on
  PostgreSQL wakes idle workers of other processes at commit, as an enqueue does
  (runtime_0002);
- the claim scans the new partial index `ix_jobs_claimable` (queued and running jobs)
  oldest first, and still checks that each job is its partition's first, so 'waiting'
  only prunes the scan: order never depends on it.

Why not 'waiting' behind the head alone: on PostgreSQL an enqueue that sees only the head
races with the head's deletion (its promotion cannot see the uncommitted new job, which
would be left 'waiting' with nothing ahead of it: 7 of 800 jobs in a test of producers
racing workers). Two jobs ahead means the job right before it must itself be claimed,
run and deleted before the enqueue commits for that to happen; the worker's
`sql.PROMOTE_STRANDED` every few seconds promotes such a job if it ever does.

Existing queued jobs with two or more jobs ahead in their partition become 'waiting' here.

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
# 128 jobs). A partition's head is read as in `sql._CLAIM` (the first (partition_key, id)
# entry at or after (partition_key, 0)): the index's first entry whatever the statistics.
POSTGRESQL_FUNCTION = f"""
CREATE FUNCTION serentak_jobs_promote() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE jobs SET status = 'queued'
    WHERE status = 'waiting'
      AND id IN (SELECT (SELECT head.id FROM jobs AS head
                         WHERE (head.partition_key, head.id) >= (freed.partition_key, 0)
                         ORDER BY head.partition_key, head.id
                         LIMIT 1)
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
      AND id = (SELECT head.id FROM jobs AS head
                WHERE (head.partition_key, head.id) >= (OLD.partition_key, 0)
                ORDER BY head.partition_key, head.id
                LIMIT 1);
END
"""

MARK_WAITING = """
UPDATE jobs SET status = 'waiting'
WHERE id IN (
    SELECT id FROM (
        SELECT id, status,
               row_number() OVER (PARTITION BY partition_key ORDER BY id) AS place
        FROM jobs
    ) AS ranked
    WHERE ranked.place > 2 AND ranked.status = 'queued'
)
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
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS jobs_promote ON jobs")
        op.execute("DROP FUNCTION IF EXISTS serentak_jobs_promote()")
    else:
        op.execute("DROP TRIGGER IF EXISTS jobs_promote")
    op.drop_index("ix_jobs_claimable", table_name="jobs")
    op.execute("UPDATE jobs SET status = 'queued' WHERE status = 'waiting'")
