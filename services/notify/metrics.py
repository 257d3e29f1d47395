"""Domain metrics of the notify service."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

DUPLICATES_PREVENTED = Counter(
    "serentak_notify_duplicates_prevented_total",
    "Redelivered events (same event_id) or notifications (same user, file, version) ignored.",
    ["stage"],
)
DIGESTS_MERGED = Counter(
    "serentak_notify_digests_merged_total",
    "Events folded into an existing unread notification of the same burst.",
)
EVENTS_SKIPPED_OLD = Counter(
    "serentak_notify_events_skipped_old_total",
    "Events not newer than the version already applied for their aggregate.",
)
EVENTS_PARKED = Counter(
    "serentak_notify_events_parked_total",
    "Events ahead of the next expected version, held in the inbox until their turn.",
)
EVENTS_APPLIED = Counter(
    "serentak_notify_events_applied_total",
    "Events accepted in version order (their fan-out job is queued).",
)
FANOUT_EVENTS = Counter(
    "serentak_notify_fanout_events_total",
    "Accepted events whose notifications a fan-out job wrote.",
)
FANOUT_INLINE_EVENTS = Counter(
    "serentak_notify_fanout_inline_events_total",
    "Accepted events whose notifications Ingest wrote in its own transaction (no job).",
)
PARKED_EVENTS = Gauge(
    "serentak_notify_parked_events",
    "Events waiting in the inbox for a missing earlier version of their file.",
)
PARKED_OLDEST_AGE = Gauge(
    "serentak_notify_parked_oldest_age_seconds",
    "How long the oldest parked event has waited (a stuck version gap keeps growing).",
)
PARKED_FILES = Gauge(
    "serentak_notify_parked_files",
    "Files with at least one parked event (each has a version gap).",
)
NOTIFICATIONS_WRITTEN = Counter(
    "serentak_notify_notifications_written_total",
    "Notifications created or updated by a digest merge.",
)
DELIVERY_LATENCY = Histogram(
    "serentak_notify_delivery_latency_seconds",
    "From a notification's commit to its send on a live Subscribe stream.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
REMOTE_READS = Counter(
    "serentak_notify_remote_reads_total",
    "Reads of other replicas' commits for this replica's streams (one per burst of "
    "wake-ups, whatever the number of users and streams woken).",
)
OPEN_STREAMS = Gauge("serentak_notify_open_streams", "Subscribe streams currently open.")
STREAMS_DROPPED = Counter(
    "serentak_notify_streams_dropped_total",
    "Subscribe streams closed because their buffer overflowed (client too slow).",
)
PURGED = Counter(
    "serentak_notify_purged_total",
    "Rows removed by the retention sweep, by table.",
    ["table"],
)
