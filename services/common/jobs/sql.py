"""Every statement of the job queue whose correctness matters, named and commented.

Invariants they keep together:
- A row in `jobs` is an unfinished job. Completion deletes it, dead-lettering moves it.
- Per-partition order: a job is claimable only if no earlier row (smaller id) with its
  partition_key exists. A job waiting for its retry therefore blocks the rest of its
  partition (order over throughput). Jobs two or more behind their partition's head are
  stored 'waiting' and promoted to 'queued' when the job ahead of them is deleted (a
  trigger, runtime_0003), so a claim never walks a deep partition; the rule above is
  still checked on every claim, so order never depends on that status.
- A claim is a lease: (claimed_by, lease_token, lease_expires_at). Everything a worker
  does afterwards is conditional on `lease_token`, so a worker whose lease ended (and
  whose job was reclaimed) can neither complete, retry nor dead-letter it.
"""

from __future__ import annotations

from sqlalchemy import JSON, Boolean, Integer, String, bindparam, text
from sqlalchemy.sql.selectable import TextualSelect

from services.common.jobs.models import UtcDateTime

_RETURNING = """
RETURNING id, job_id, job_type, partition_key, idempotency_key, payload, correlation_id,
          traceparent, attempts, enqueued_at, run_after, first_attempt_at, lease_token,
          claimed_by,
          EXISTS (SELECT 1 FROM applied_jobs AS a
                  WHERE a.idempotency_key = jobs.idempotency_key) AS already_applied
"""

# Pick up to :limit of the oldest claimable jobs and lease them, in one statement.
# Claimable: queued and due, or running with an expired lease (its worker died: the job
# runs again, nothing stays "running" forever); 'waiting' rows (two or more behind their
# partition's head) are not looked at. Only the head of a partition (its first row by id)
# qualifies. The head is read as the first entry at or after (partition_key, 0) in
# (partition_key, id) order, which only ix_jobs_partition_key_id gives without a sort:
# "no earlier row" (NOT EXISTS) and "min(id) of the partition" were both planned, on a
# partition 20,000 deep, as a primary-key scan filtering on partition_key (20,000 rows a
# probe: the statistics of one huge partition say any partition matches most rows),
# so the picked jobs are in distinct partitions and per-partition order holds whatever
# the batch size.
# PostgreSQL: FOR UPDATE SKIP LOCKED lets concurrent workers pass over a row another
# worker is claiming instead of queueing behind it; under READ COMMITTED the locked row
# is re-checked against the WHERE clause after the lock, so a row claimed meanwhile is
# dropped. MATERIALIZED makes the locking pick run exactly once (an inlined sub-select
# could be re-evaluated by the planner and lock more rows than it returns).
# SQLite: the transaction is BEGIN IMMEDIATE (one writer), so the statement alone is
# atomic. dedupe_key is cleared so later enqueues start a new collapse window.
# `already_applied` folds the idempotency probe into the claim's round trip: such a job
# is acknowledged without running its handler. The probe is an optimisation only; the
# unique key on applied_jobs is what keeps effects exactly-once.
_CLAIM = """
WITH picked AS MATERIALIZED (
    SELECT j.id FROM jobs AS j {scan}
    WHERE j.status IN ('queued', 'running')
      AND j.job_type IN :job_types
      AND ((j.status = 'queued' AND j.run_after <= :now)
           OR (j.status = 'running' AND j.lease_expires_at < :now))
      AND j.id = (
          SELECT head.id FROM jobs AS head
          WHERE (head.partition_key, head.id) >= (j.partition_key, 0)
          ORDER BY head.partition_key, head.id
          LIMIT 1
      )
    ORDER BY j.id
    LIMIT :limit
    {lock}
)
UPDATE jobs
SET status = 'running',
    claimed_by = :worker_id,
    lease_token = :lease_token,
    lease_expires_at = :lease_until,
    attempts = attempts + 1,
    first_attempt_at = COALESCE(first_attempt_at, :now),
    last_attempt_at = :now,
    dedupe_key = NULL
WHERE id IN (SELECT id FROM picked)
"""


def _typed(sql: str) -> TextualSelect:
    return (
        text(sql)
        .bindparams(bindparam("job_types", expanding=True))
        .columns(
            payload=JSON,
            enqueued_at=UtcDateTime,
            run_after=UtcDateTime,
            first_attempt_at=UtcDateTime,
            attempts=Integer,
            lease_token=String,
            already_applied=Boolean,
        )
    )


CLAIM_POSTGRESQL = _typed(_CLAIM.format(scan="", lock="FOR UPDATE SKIP LOCKED") + _RETURNING)
# SQLite has no statistics unless ANALYZE is run, and then prefers the job_type index
# (every job of the type, waiting ones too) over the partial index of heads.
CLAIM_SQLITE = _typed(_CLAIM.format(scan="INDEXED BY ix_jobs_claimable", lock="") + _RETURNING)

# A partition head left 'waiting' (runtime_0003: on PostgreSQL, an enqueue that saw two
# jobs ahead and committed only after the one right ahead of it was claimed, run and
# deleted, whose promotion could not see it). Workers run this every few seconds. The
# heads come from one pass over the (partition_key, id) index, not a probe per row.
PROMOTE_STRANDED = text(
    """
UPDATE jobs SET status = 'queued'
WHERE status = 'waiting'
  AND id IN (SELECT min(heads.id) FROM jobs AS heads GROUP BY heads.partition_key)
"""
)

# Extend the lease while the handler runs. 0 rows: the lease is gone (reclaimed).
HEARTBEAT = text(
    """
UPDATE jobs SET lease_expires_at = :lease_until
WHERE id = :id AND lease_token = :lease_token
"""
)

# Finish the job, in the handler's transaction. 0 rows: the lease was lost and someone
# else owns the job; the caller rolls back so the handler's effects vanish with it.
COMPLETE = text("DELETE FROM jobs WHERE id = :id AND lease_token = :lease_token")

# Record the job's effect under its idempotency key, in the handler's transaction.
# No row back: a job with the same key committed first; the caller rolls back (its
# effects with it). ON CONFLICT instead of catching the unique violation: a failed
# statement would abort a PostgreSQL transaction, and a savepoint costs two round trips.
# A concurrent uncommitted insert of the same key makes this wait for that transaction,
# then either conflict (it committed) or insert (it rolled back): exactly one wins.
RECORD_APPLIED = text(
    """
INSERT INTO applied_jobs (idempotency_key, job_type, job_id, effect, applied_at)
VALUES (:idempotency_key, :job_type, :job_id, :effect, :applied_at)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id
"""
).bindparams(bindparam("effect", type_=JSON), bindparam("applied_at", type_=UtcDateTime))

# COMPLETE and RECORD_APPLIED in one round trip (PostgreSQL's data-modifying CTEs): the
# effect is recorded only if the lease was still ours. completed = 0: lease lost;
# completed = 1 and recorded = 0: already applied. Either way the caller rolls back.
COMPLETE_AND_RECORD_POSTGRESQL = text(
    """
WITH done AS (
    DELETE FROM jobs WHERE id = :id AND lease_token = :lease_token RETURNING id
), recorded AS (
    INSERT INTO applied_jobs (idempotency_key, job_type, job_id, effect, applied_at)
    SELECT :idempotency_key, :job_type, :job_id, CAST(:effect AS json),
           CAST(:applied_at AS timestamptz)
    FROM done
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id
)
SELECT (SELECT count(*) FROM done) AS completed, (SELECT count(*) FROM recorded) AS recorded
"""
).bindparams(bindparam("effect", type_=JSON), bindparam("applied_at", type_=UtcDateTime))

# Put a failed job back in the queue for a later attempt; it keeps its id, so it keeps
# its place at the head of its partition.
RESCHEDULE = text(
    """
UPDATE jobs
SET status = 'queued', run_after = :run_after, claimed_by = NULL, lease_token = NULL,
    lease_expires_at = NULL, last_error_class = :error_class,
    last_error_message = :error_message
WHERE id = :id AND lease_token = :lease_token
"""
)

# Hand a job back untouched (graceful shutdown): the attempt it used does not count.
RELEASE = text(
    """
UPDATE jobs
SET status = 'queued', claimed_by = NULL, lease_token = NULL, lease_expires_at = NULL,
    attempts = attempts - 1
WHERE id = :id AND lease_token = :lease_token
"""
)

# Remove a job to dead-letter it; the caller inserts the dead letter in the same
# transaction only when this returned a row (the lease was still ours).
TAKE_FOR_DEAD_LETTER = text(
    """
DELETE FROM jobs WHERE id = :id AND lease_token = :lease_token
RETURNING enqueued_at, first_attempt_at, last_attempt_at
"""
).columns(enqueued_at=UtcDateTime, first_attempt_at=UtcDateTime, last_attempt_at=UtcDateTime)

# Mark a dead letter replayed; exactly one concurrent replay wins (replayed_at IS NULL).
MARK_REPLAYED = text(
    """
UPDATE dead_letters SET replayed_at = :now
WHERE id = :id AND replayed_at IS NULL
"""
)

# Acknowledge a batch of jobs whose handlers wrote nothing in their transaction (a no-op,
# or effects outside this database), in one statement: COMPLETE_AND_RECORD for each row of
# the unnest arrays. Each job is deleted only if its lease is still ours, and its key is
# recorded only if it was deleted; a key already taken (by an earlier attempt or another
# job in the batch) is left as it is. Keys are inserted in key order, so two batches that
# share keys wait for each other in one order and cannot deadlock on the unique index.
COMPLETE_BATCH_POSTGRESQL = text(
    """
WITH input AS (
    SELECT * FROM unnest(
        CAST(:ids AS bigint[]), CAST(:lease_tokens AS varchar[]),
        CAST(:idempotency_keys AS varchar[]), CAST(:job_types AS varchar[]),
        CAST(:job_ids AS varchar[]), CAST(:effects AS text[])
    ) AS t(id, lease_token, idempotency_key, job_type, job_id, effect)
), done AS (
    DELETE FROM jobs USING input
    WHERE jobs.id = input.id AND jobs.lease_token = input.lease_token
    RETURNING jobs.id
), recorded AS (
    INSERT INTO applied_jobs (idempotency_key, job_type, job_id, effect, applied_at)
    SELECT input.idempotency_key, input.job_type, input.job_id, CAST(input.effect AS json),
           CAST(:applied_at AS timestamptz)
    FROM input JOIN done ON done.id = input.id
    ORDER BY input.idempotency_key, input.id
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING job_id
)
SELECT input.id,
       EXISTS (SELECT 1 FROM done WHERE done.id = input.id) AS completed,
       EXISTS (SELECT 1 FROM recorded WHERE recorded.job_id = input.job_id) AS recorded
FROM input
"""
).bindparams(bindparam("applied_at", type_=UtcDateTime))
