"""Prometheus metrics of the upstream sync engine."""

from __future__ import annotations

from prometheus_client import Counter

UPSTREAM_CALLS = Counter(
    "serentak_sync_upstream_calls_total",
    "Upstream HTTP calls, by operation and status code (or timeout/unreachable).",
    ["operation", "status"],
)
TOMBSTONES = Counter(
    "serentak_sync_tombstones_total",
    "Synced items tombstoned, by reason (gone, expired, removed).",
    ["reason"],
)
RETRIES = Counter(
    "serentak_sync_retries_total",
    "Item or delta syncs scheduled again, by kind (not_found, retry_after, transient).",
    ["kind"],
)
DEAD_LETTERS = Counter(
    "serentak_sync_gave_up_total",
    "Syncs handed to the dead-letter queue, by cause (not_found, auth, foreign_link, permanent).",
    ["cause"],
)
AUTH_FAILURES = Counter(
    "serentak_sync_auth_failures_total",
    "Upstream 401/403 answers: credentials need an operator (alert on any).",
)
FOREIGN_LINKS = Counter(
    "serentak_sync_foreign_links_total",
    "Next/delta links off the provider's origin, refused unfetched (alert on any).",
)
DELTA_PAGES = Counter("serentak_sync_delta_pages_total", "Delta pages fetched.")
FULL_RESYNCS = Counter(
    "serentak_sync_full_resyncs_total",
    "Full re-enumerations (an expired delta cursor, or a subscription the provider removed).",
)
WEBHOOK_DELIVERIES = Counter(
    "serentak_sync_webhook_deliveries_total",
    "Webhook requests, by outcome (validated, accepted, refused, invalid, unknown_drive).",
    ["outcome"],
)
TOMBSTONED_SKIPS = Counter(
    "serentak_sync_tombstoned_skips_total",
    "Sync jobs that found their item tombstoned and made no upstream call.",
)
PURGED = Counter(
    "serentak_sync_purged_total",
    "Tombstones purged past retention, by what (bytes, rows).",
    ["what"],
)
SUBSCRIPTION_OPERATIONS = Counter(
    "serentak_sync_subscription_operations_total",
    "Subscription creates, renewals and deletes, by operation (create, renew, delete) and "
    "outcome (ok, failed, not_found: the provider no longer has the subscription).",
    ["operation", "outcome"],
)
LIFECYCLE_EVENTS = Counter(
    "serentak_sync_lifecycle_events_total",
    "Accepted lifecycle notifications, by lifecycleEvent (subscriptionRemoved, missed, "
    "reauthorizationRequired, other).",
    ["event"],
)
