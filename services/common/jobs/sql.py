"""Every statement of the job queue whose correctness matters, named and commented.

Invariants they keep together:
- A row in `jobs` is an unfinished job. Completion deletes it, dead-lettering moves it.
- Per-partition order: a job is claimable only if no earlier row (smaller id) with its
  partition_key exists. A job waiting for its retry therefore blocks the rest of its
  partition (order over throughput).
- A claim is a lease: (claimed_by, lease_token, lease_expires_at). Everything a worker
  does afterwards is conditional on `lease_token`, so a worker whose lease ended (and
  whose job was reclaimed) can neither complete, retry nor dead-letter it.
"""

from __future__ import annotations

from sqlalchemy import JSON, Integer, String, bindparam, text
from sqlalchemy.sql.selectable import TextualSelect

from services.common.jobs.models import UtcDateTime

_RETURNING = """
RETURNING id, job_id, job_type, partition_key, idempotency_key, payload, correlation_id,
          attempts, enqueued_at, run_after, first_attempt_at, lease_token, claimed_by
"""

# Pick the oldest claimable job and lease it, in one statement.
# Claimable: queued and due, or running with an expired lease (its worker died: the job
# runs again, nothing stays "running" forever). Only the head of a partition qualifies.
# PostgreSQL: FOR UPDATE SKIP LOCKED lets concurrent workers pass over a row another
# worker is claiming instead of queueing behind it; under READ COMMITTED the locked row
# is re-checked against the WHERE clause after the lock, so a row claimed meanwhile is
# dropped. SQLite: the transaction is BEGIN IMMEDIATE (one writer), so the statement
# alone is atomic. dedupe_key is cleared so later enqueues start a new collapse window.
_CLAIM = """
UPDATE jobs
SET status = 'running',
    claimed_by = :worker_id,
    lease_token = :lease_token,
    lease_expires_at = :lease_until,
    attempts = attempts + 1,
    first_attempt_at = COALESCE(first_attempt_at, :now),
    last_attempt_at = :now,
    dedupe_key = NULL
WHERE id = (
    SELECT j.id FROM jobs AS j
    WHERE j.job_type IN :job_types
      AND ((j.status = 'queued' AND j.run_after <= :now)
           OR (j.status = 'running' AND j.lease_expires_at < :now))
      AND NOT EXISTS (
          SELECT 1 FROM jobs AS earlier
          WHERE earlier.partition_key = j.partition_key AND earlier.id < j.id
      )
    ORDER BY j.id
    LIMIT 1
    {lock}
)
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
        )
    )


CLAIM_POSTGRESQL = _typed(_CLAIM.format(lock="FOR UPDATE SKIP LOCKED") + _RETURNING)
CLAIM_SQLITE = _typed(_CLAIM.format(lock="") + _RETURNING)

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
