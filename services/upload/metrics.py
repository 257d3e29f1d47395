"""Domain metrics of the upload service (each with a one-line description)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CHUNK_CONFLICTS = Counter(
    "serentak_upload_chunk_conflicts_total",
    "Chunks refused because the index was stored with another checksum or size.",
)
CHUNK_DUPLICATES = Counter(
    "serentak_upload_chunk_duplicates_total",
    "Idempotent chunk retries answered with duplicate=true and no new effect.",
)
BYTES_RECEIVED = Counter(
    "serentak_upload_bytes_received_total",
    "Chunk bytes callers sent to PutChunk/UploadChunks (stored, repeated or refused).",
)
BYTES_SENT = Counter("serentak_download_bytes_sent_total", "File bytes sent by Download.")
TUS_BYTES_RECEIVED = Counter(
    "serentak_tus_bytes_received_total",
    "Body bytes tus clients sent in PATCH and POST (applied, spooled or refused).",
)
TUS_REQUESTS = Counter(
    "serentak_tus_requests_total",
    "tus endpoint requests answered, by method and status.",
    ["method", "status"],
)
CHUNKS_STORED = Counter("serentak_upload_chunks_stored_total", "Chunks stored for the first time.")
DUPLICATE_MERGES_REFUSED = Counter(
    "serentak_upload_duplicate_merges_refused_total",
    "Merge jobs that found their upload no longer merging and did nothing.",
)
MERGES = Counter("serentak_upload_merges_total", "Merges finished, by outcome.", ["outcome"])
COMMIT_GROUP_UNITS = Histogram(
    "serentak_upload_commit_group_units",
    "Units of work committed per group-commit transaction (UploadFile commits, download"
    " audit rows): 1 when calls come one at a time, more under concurrency.",
    buckets=(1, 2, 4, 8, 16, 32, 64),
)
INLINE_MERGES = Counter(
    "serentak_upload_inline_merges_total",
    "Merge jobs run in the request that started them (UploadFile, or the last chunk of a"
    " small upload), by path; their outcomes count in serentak_upload_merges_total.",
    ["path"],
)
MERGE_DURATION = Histogram(
    "serentak_upload_merge_duration_seconds",
    "Time of one merge job from start to commit.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
BLOB_STORE_ERRORS = Counter(
    "serentak_upload_blob_store_errors_total",
    "Object store requests that failed (answered BLOB_STORE_UNAVAILABLE), by operation.",
    ["operation"],
)
MULTIPART_UPLOADS_ABORTED = Counter(
    "serentak_upload_multipart_uploads_aborted_total",
    "Unfinished S3 multipart uploads of merges aborted, by reason (merge_failed, rerun: a"
    " killed predecessor's, sweep: recorded and past the grace, listed: found by listing).",
    ["reason"],
)
CACHE_HITS = Counter(
    "serentak_upload_listing_cache_hits_total", "Folder listings served from cache."
)
CACHE_MISSES = Counter(
    "serentak_upload_listing_cache_misses_total", "Folder listings read from the DB."
)
CACHE_INVALIDATIONS = Counter(
    "serentak_upload_listing_cache_invalidations_total",
    "Folder listing cache entries dropped after a commit changed the folder.",
)
EXPIRED_UPLOADS = Counter("serentak_upload_expired_total", "Uploads moved to expired by the sweep.")
PURGED_CHUNKS = Counter(
    "serentak_upload_purged_chunk_files_total",
    "Chunk files deleted for expired or aborted uploads.",
)
UPLOADS_MERGING = Gauge("serentak_upload_merging", "Uploads currently in merging (last audit).")
MERGE_FAILURE_REASONS = ("missing_chunk", "checksum", "size", "duplicate_chunk", "lock")
MERGE_FAILURES = Counter(
    "serentak_upload_merge_failures_total",
    "Merge attempts that found the chunk set unusable, by reason (missing_chunk, checksum, ...).",
    ["reason"],
)
# Every reason exported at 0 from the start, so increase() sees the first failure.
for _reason in MERGE_FAILURE_REASONS:
    MERGE_FAILURES.labels(_reason)
OLDEST_IN_STATUS = Gauge(
    "serentak_upload_oldest_in_status_seconds",
    "Age of the oldest upload in a status (uploading: since created; merging: since merge start).",
    ["status"],
)
QUOTA_USED_RATIO_MAX = Gauge(
    "serentak_upload_tenant_quota_used_ratio_max",
    "Highest share of the tenant storage quota any tenant uses (files + open uploads).",
)
CHUNK_INDEX_CONFLICT_REPEATS = Counter(
    "serentak_upload_chunk_index_conflict_repeats_total",
    "Chunk conflicts on an (upload, index) that already conflicted on this replica.",
)
BYTES_RECLAIMED = Counter(
    "serentak_upload_bytes_reclaimed_total",
    "Bytes the storage lifecycle deleted from the blob store, by kind (completed_chunks,"
    " failed_chunks, failed_output, old_version, orphan, temp).",
    ["kind"],
)
STATUS_SECONDS = Histogram(
    "serentak_upload_status_seconds",
    "Time an upload spent in a status: uploading (created -> merging), merging (merge start"
    " -> completed or failed).",
    ["status"],
    buckets=(0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600),
)
UPLOADS_MISSING_CHUNKS = Gauge(
    "serentak_upload_uploads_missing_chunks",
    "Uploads in `uploading` that still lack chunks (sampled with the status ages).",
)
CHUNK_CONFLICTS_BY_INDEX = Counter(
    "serentak_upload_chunk_conflicts_by_index_total",
    "Chunk conflicts by chunk index bucket (0, 1-9, 10-99, 100-999, 1000+).",
    ["bucket"],
)


def index_bucket(index: int) -> str:
    """The chunk-index bucket label of CHUNK_CONFLICTS_BY_INDEX."""
    if index == 0:
        return "0"
    for bound, label in ((10, "1-9"), (100, "10-99"), (1000, "100-999")):
        if index < bound:
            return label
    return "1000+"


CHUNK_COMMIT_BATCH = Histogram(
    "serentak_upload_chunk_commit_batch_chunks",
    "Chunks recorded by one group commit (one transaction).",
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64),
)
UPLOAD_WAITERS = Gauge(
    "serentak_upload_waiters",
    "GetUpload calls waiting on this replica for their upload to finish (wait_finished_ms).",
)
CHANGE_WAITERS = Gauge(
    "serentak_upload_change_waiters",
    "ListChanges calls waiting on this replica for the next change of their view (wait_ms).",
)
UPLOAD_WAIT_SECONDS = Histogram(
    "serentak_upload_wait_seconds",
    "Time one GetUpload call waited for its upload to finish, by outcome (finished,"
    " timed_out, cancelled, stopped: the replica stopped).",
    ["outcome"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
UPLOAD_WAIT_RECHECKS = Counter(
    "serentak_upload_wait_rechecks_total",
    "Fallback re-reads of the waited uploads' status (one query each, for every waiter).",
)
TRASH_PURGED = Counter(
    "serentak_upload_trash_purged_total",
    "Items the upload.purge_trash job removed from the trash past retention, by kind"
    " (file, folder).",
    ["kind"],
)
TRASH_PURGED_BYTES = Counter(
    "serentak_upload_trash_purged_bytes_total",
    "Sizes of the files purged from the trash (quota released; the blob store's bytes are"
    " reclaimed by upload.reclaim, kind retired).",
)
UPLOAD_ROWS_FORGOTTEN = Counter(
    "serentak_upload_rows_forgotten_total",
    "Upload rows (with their chunk rows) deleted once their file was purged and their"
    " bytes reclaimed.",
)
