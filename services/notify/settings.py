"""Settings of the notify service."""

from __future__ import annotations

from pydantic import Field

from services.common.config import CommonSettings, sqlite_url

DAY_SECONDS = 24 * 3600


class NotifySettings(CommonSettings):
    """Read once at start-up from `SERENTAK_*`."""

    ingest_principals: list[str] = Field(
        default_factory=lambda: ["upload"], description="Service principals allowed to Ingest."
    )
    notify_max_message_bytes: int = Field(
        1024 * 1024,
        ge=1024,
        description="Largest request accepted (an Ingest event).",
    )
    notify_database_url: str | None = Field(
        None, description="SQLAlchemy URL; default: SQLite at {data_dir}/notify.db."
    )
    digest_window_seconds: float = Field(
        2.0, ge=0, description="Events sharing a dedupe_key this close together become one."
    )
    stream_buffer_size: int = Field(
        1000, ge=1, description="Notifications queued per Subscribe stream before it is dropped."
    )
    # Rate limits per window (SERENTAK_RATE_LIMIT_WINDOW_SECONDS) over all replicas
    # (services/notify/rate_families.py); 0: none. RATE_LIMITED with RetryInfo past one;
    # the relay's Ingest and IngestBatch (a service principal) are never limited.
    rate_limit_subscribe_per_user: int = Field(
        6000,
        ge=0,
        description="Subscribe calls plus the stream messages they are sent, per user and "
        "window: past it the stream ends RATE_LIMITED (resume from the last cursor).",
    )
    rate_limit_subscribe_per_tenant: int = Field(
        600000,
        ge=0,
        description="Subscribe calls and messages of one tenant's users together per window"
        " (one share with 10,000 users sends 10,000).",
    )
    rate_limit_acks_per_user: int = Field(
        3000, ge=0, description="MarkRead calls one user may make per window."
    )
    rate_limit_acks_per_tenant: int = Field(
        30000, ge=0, description="MarkRead calls one tenant's users may make together per window."
    )
    rate_limit_inbox_per_user: int = Field(
        3000,
        ge=0,
        description="ListNotifications and GetUnreadCount calls one user may make per window.",
    )
    rate_limit_inbox_per_tenant: int = Field(
        30000,
        ge=0,
        description="ListNotifications and GetUnreadCount calls of one tenant's users per window.",
    )
    default_page_size: int = Field(50, ge=1, description="ListNotifications page size default.")
    max_page_size: int = Field(500, ge=1, description="Largest ListNotifications page.")
    max_audience: int = Field(
        20_000,
        ge=1,
        description="Most audience users one event may carry: room for a folder shared with "
        "10,000 users and its owners (an event past it is refused for good: dead-lettered).",
    )
    read_retention_seconds: float = Field(
        30 * DAY_SECONDS, gt=0, description="Read notifications older than this are purged."
    )
    unread_retention_seconds: float = Field(
        180 * DAY_SECONDS,
        ge=0,
        description="Unread notifications older than this are purged too (the badge drops "
        "with them); 0 keeps them until read.",
    )
    inbox_retention_seconds: float = Field(
        30 * DAY_SECONDS,
        gt=0,
        description="Finished inbox rows older than this are purged (version order still "
        "skips a very late duplicate as old).",
    )
    retired_aggregate_retention_seconds: float = Field(
        30 * DAY_SECONDS,
        gt=0,
        description="A file's applied-version row is deleted this long after its terminal "
        "event (file.purged) retired it; keep it longer than the upload service's "
        "SERENTAK_OUTBOX_RETENTION_SECONDS (7 days), so no redelivery can still arrive.",
    )
    retention_interval_seconds: float = Field(
        3600.0, gt=0, description="How often the retention job runs (periodic schedule)."
    )
    ingest_batch_max: int = Field(
        500, ge=1, description="Most events one IngestBatch call may carry."
    )
    fanout_batch_max: int = Field(
        50, ge=1, description="Most accepted events of one file a fan-out job writes at once."
    )
    inline_fanout_max: int = Field(
        2_000,
        ge=0,
        description="Most notifications an Ingest transaction writes itself (then publishes "
        "right after its commit, no fan-out job); bigger audiences and digest folds go to a "
        "fan-out job. 0: always a job.",
    )
    worker_concurrency: int = Field(8, ge=1, description="Jobs one worker runs at a time.")
    worker_lease_seconds: float = Field(
        30.0, gt=0, description="Job lease; a dead worker's job runs again after it."
    )
    worker_poll_seconds: float = Field(
        0.5, gt=0, description="Idle workers poll this often (in-process enqueues wake them)."
    )
    notify_gc_freeze: bool = Field(
        True,
        description="Freeze the objects alive after start-up out of the garbage collector's "
        "reach (gc.freeze): a full collection then stops the event loop ~3 ms instead of "
        "45-86 ms, the commit -> delivery p99 (services/notify/gc_tuning.py).",
    )
    notify_gc_young_threshold: int = Field(
        50_000,
        ge=0,
        description="With notify_gc_freeze: allocations between young collections (CPython's "
        "default is 700). A fan-out's short-lived objects then die before a collection "
        "promotes them; at 10,000 open streams the default made full collections of up to "
        "0.7 s (services/notify/gc_tuning.py). 0: CPython's thresholds.",
    )
    # Capacity (services/common/call_capacity.py): service calls have a pool of their own
    # and users' streams their own caps, so no number of user streams refuses the relay's
    # IngestBatch; users' other calls are bounded by `max_concurrent_rpcs`.
    service_calls_max: int = Field(
        100,
        ge=1,
        description="Service principals' calls (Ingest, IngestBatch, admin) one replica runs "
        "at once, whatever users hold: each upload replica's relay sends at most 4 at once, "
        "so room for 20 upload replicas and operators.",
    )
    streams_max: int = Field(
        10_000,
        ge=1,
        description="Subscribe (and other response) streams of users open at once on one "
        "replica; more: RESOURCE_EXHAUSTED / STREAM_LIMIT_SERVER.",
    )
    streams_per_tenant_max: int = Field(
        5_000,
        ge=1,
        description="Streams one tenant may hold open on one replica: half of streams_max, so "
        "one tenant never takes a whole replica (the balancer spreads a large tenant over the "
        "replicas); a single-tenant deployment sets it to streams_max. More: "
        "STREAM_LIMIT_TENANT.",
    )
    streams_per_user_max: int = Field(
        20,
        ge=1,
        description="Streams one user may hold open on one replica: a phone, a laptop and a "
        "dozen browser tabs, not a leaking client. More: STREAM_LIMIT_USER.",
    )
    call_retry_seconds: float = Field(
        1.0,
        gt=0,
        description="RetryInfo delay of a call refused by a full call pool (plus up to half "
        "again at random).",
    )
    stream_retry_seconds: float = Field(
        10.0,
        gt=0,
        description="RetryInfo delay of a stream refused by a full stream cap (plus up to half "
        "again at random): a slot frees only when a stream closes.",
    )
    parked_sample_seconds: float = Field(
        15.0, gt=0, description="How often the parked-event gauges are refreshed."
    )

    @property
    def database_url(self) -> str:
        """The configured database, or the embedded SQLite default."""
        return self.notify_database_url or sqlite_url(self.data_dir, "notify")
