"""Prometheus metrics of the job runtime (queue, worker, dead letters, outbox)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

QUEUE_DEPTH = Gauge(
    "serentak_job_queue_depth", "Unfinished jobs (queued or running), by job type.", ["job_type"]
)
QUEUE_LAG = Gauge(
    "serentak_job_queue_lag_seconds",
    "Age of the oldest due job nobody has claimed yet, by job type.",
    ["job_type"],
)
JOB_DURATION = Histogram(
    "serentak_job_duration_seconds",
    "Handler run time including the commit, by job type and outcome.",
    ["job_type", "outcome"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
JOB_START_LAG = Histogram(
    "serentak_job_start_lag_seconds",
    "Time from a job being due to its handler starting, by job type.",
    ["job_type"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
JOB_RETRIES = Counter(
    "serentak_job_retries_total",
    "Failed attempts that will be retried, by error class.",
    ["job_type", "error_class"],
)
JOB_DEAD_LETTERED = Counter(
    "serentak_job_dead_lettered_total",
    "Jobs moved to the dead-letter table, by error class.",
    ["job_type", "error_class"],
)
DLQ_SIZE = Gauge(
    "serentak_dead_letters", "Dead letters waiting for an operator, by job type.", ["job_type"]
)
JOBS_ALREADY_APPLIED = Counter(
    "serentak_jobs_already_applied_total",
    "Jobs acknowledged without running because their idempotency key was applied.",
    ["job_type"],
)
LEASES_LOST = Counter(
    "serentak_job_leases_lost_total", "Jobs whose lease ended before they finished.", ["job_type"]
)
OUTBOX_OLDEST_AGE = Gauge(
    "serentak_outbox_oldest_unpublished_age_seconds", "Age of the oldest unpublished event."
)
OUTBOX_UNPUBLISHED = Gauge("serentak_outbox_unpublished_events", "Events not yet published.")
OUTBOX_PUBLISHED = Counter(
    "serentak_outbox_published_total", "Events published to a subscriber.", ["event_type"]
)
OUTBOX_PUBLISH_FAILURES = Counter(
    "serentak_outbox_publish_failures_total", "Failed publish attempts.", ["event_type"]
)
OUTBOX_DEAD_LETTERS = Counter(
    "serentak_outbox_dead_letters_total",
    "Events a subscriber refused for good, moved to dead_letters (job type outbox.publish).",
    ["event_type"],
)
EVENTS_SKIPPED_AS_OLD = Counter(
    "serentak_events_skipped_as_old_total",
    "Events older than the state they apply to (version < current), skipped.",
    ["event_type"],
)
PERIODIC_RUNS = Counter(
    "serentak_periodic_ticks_total", "Periodic ticks this replica enqueued.", ["job_type"]
)
ROWS_PURGED = Counter(
    "serentak_rows_purged_total",
    "Rows the runtime_retention job deleted past their retention, by table (outbox_events,"
    " applied_jobs, dead_letters, audit_events).",
    ["table"],
)
