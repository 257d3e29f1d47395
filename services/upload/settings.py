"""Settings of the upload service."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator

from services.common.config import CommonSettings, sqlite_url

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB


class UploadSettings(CommonSettings):
    """Read once at start-up from `SERENTAK_*`."""

    upload_database_url: str | None = Field(
        None, description="SQLAlchemy URL; default: SQLite at {data_dir}/upload.db."
    )
    blob_dir: Path | None = Field(
        None, description="Chunks and merged files; default data_dir/blobs."
    )
    blob_url: str | None = Field(
        None,
        description="Where blobs live: file:///path (default: blob_dir) or s3://bucket/prefix.",
    )
    s3_endpoint: str | None = Field(
        None, description="S3-compatible endpoint URL (MinIO, Ceph RGW, R2...); None: AWS."
    )
    s3_region: str = Field("us-east-1", description="S3 region (signing).")
    s3_access_key_id: str | None = Field(None, description="S3 access key id.")
    s3_secret_access_key: SecretStr | None = Field(None, description="S3 secret access key.")
    s3_allow_http: bool = Field(False, description="Allow a plain-HTTP S3 endpoint (tests).")
    s3_ca_file: Path | None = Field(
        None,
        description="CA (PEM) of an S3 endpoint with a private certificate (on-prem MinIO...), "
        "trusted with the system's roots; read at start (empty: the system's roots only).",
    )
    s3_path_style: bool = Field(
        True, description="Path-style requests (endpoint/bucket/key); False: virtual-hosted."
    )
    s3_part_size: int = Field(
        8 * MIB, ge=5 * MIB, description="Multipart part size of merged files on S3 (>= 5 MiB)."
    )
    s3_merge_concurrency: int = Field(
        4,
        ge=1,
        description="Chunk GETs and multipart parts in flight per S3 merge (memory: this x"
        " (a chunk + a part)).",
    )
    blob_fsync: bool = Field(
        True, description="fsync chunk and merged files (off only for throwaway test data)."
    )
    upload_ttl_seconds: float = Field(
        24 * 3600, gt=0, description="An upload idle this long becomes expired."
    )
    min_chunk_size: int = Field(
        256 * KIB, ge=1, description="Smallest chunk_size (the last chunk may be shorter)."
    )
    # 32 MiB, not 64: a chunk plus its envelope must fit the 64 MiB gRPC message limit.
    max_chunk_size: int = Field(32 * MIB, ge=1, description="Largest chunk_size.")
    default_chunk_size: int = Field(8 * MIB, ge=1, description="What the CLI sends by default.")
    max_total_chunks: int = Field(10_000, ge=1, description="Most chunks in one upload.")
    # Limits (issue 11): refusals are RESOURCE_EXHAUSTED with an ErrorInfo reason.
    max_upload_bytes: int = Field(
        10 * GIB, ge=0, description="Largest file one upload may make (UPLOAD_TOO_LARGE)."
    )
    tenant_quota_bytes: int = Field(
        100 * GIB,
        ge=0,
        description="Per tenant: current versions of its files (trash included) plus open "
        "uploads (QUOTA_EXCEEDED).",
    )
    max_open_uploads_per_user: int = Field(
        100, ge=1, description="Uploads one user may have uploading or merging (TOO_MANY_UPLOADS)."
    )
    share_batch_max: int = Field(
        1_000,
        ge=1,
        description="Most grants one ShareFileBatch call may carry (TOO_MANY_GRANTS): one "
        "transaction and one event, whose audience notify caps at SERENTAK_MAX_AUDIENCE.",
    )
    # Rate limits per window (SERENTAK_RATE_LIMIT_WINDOW_SECONDS) over all replicas
    # (services/upload/rate_families.py); 0: none. RATE_LIMITED with RetryInfo past one.
    rate_limit_writes_per_user: int = Field(
        6000,
        ge=0,
        description="Writes one user may make per window: CreateUpload, PutChunk, each "
        "UploadChunks message, UploadFile, AbortUpload, folder and file changes, RestoreVersion, "
        "sync links.",
    )
    rate_limit_writes_per_tenant: int = Field(
        60000, ge=0, description="Writes one tenant's users may make together per window."
    )
    rate_limit_reads_per_user: int = Field(
        6000,
        ge=0,
        description="Reads one user may make per window: GetUpload, ListUploads, GetFile, "
        "ListFolder, collaborators, shared-with-me, Download, ListVersions, GetSyncStatus.",
    )
    rate_limit_reads_per_tenant: int = Field(
        60000, ge=0, description="Reads one tenant's users may make together per window."
    )
    rate_limit_sharing_per_user: int = Field(
        600,
        ge=0,
        description="ShareFile, ShareFileBatch and UnshareFile calls one user may make per window.",
    )
    rate_limit_sharing_per_tenant: int = Field(
        6000, ge=0, description="Sharing calls one tenant's users may make together per window."
    )
    upload_max_message_bytes: int | None = Field(
        None, ge=1024, description="Largest request; default: max_chunk_size + 1 MiB."
    )
    merge_lock_ttl_seconds: int = Field(
        10,
        ge=2,
        description="Lease of the merge's file lock, kept alive by its Hold stream while the"
        " merge commits: a crashed merge's lock frees within this.",
    )
    merge_lock_wait_ms: int = Field(30_000, ge=0, description="How long a merge waits for it.")
    inline_merge_max_bytes: int = Field(
        4 * MIB,
        ge=0,
        description="A chunked upload this small (total_size) is merged in the PutChunk or"
        " UploadChunks call that completes it, before the answer, instead of by the job"
        " runtime (0: never). UploadFile always merges in its request.",
    )
    merge_max_attempts: int = Field(
        8, ge=1, description="Merge attempts before the upload fails and the job is dead-lettered."
    )
    merge_retry_base_seconds: float = Field(
        0.5, ge=0, description="Backoff base between merge attempts (full jitter, doubling)."
    )
    merge_retry_cap_seconds: float = Field(30.0, ge=0, description="Longest merge backoff.")
    listing_cache_entries: int = Field(10_000, ge=0, description="Folder pages kept in memory.")
    # GetUpload's wait_finished_ms (services/upload/ingest/finish_waits.py).
    upload_wait_max_ms: int = Field(
        60_000,
        ge=0,
        description="Longest GetUpload wait_finished_ms honoured (a longer one is cut to this;"
        " 0: never wait).",
    )
    upload_wait_recheck_ms: int = Field(
        250,
        gt=0,
        description="While GetUpload calls wait, this replica re-reads their uploads' status this"
        " often (one query for all of them), to see what other replicas committed.",
    )
    upload_wait_max_waiters: int = Field(
        500,
        ge=0,
        description="GetUpload calls one replica lets wait at once (UPLOAD_WAITER_LIMIT past"
        " it); keep it well below SERENTAK_MAX_CONCURRENT_RPCS.",
    )
    expiry_interval_seconds: float = Field(60.0, gt=0, description="Cleanup sweep period.")
    reclaim_interval_seconds: float = Field(
        300.0, gt=0, description="Storage lifecycle sweep period (upload.reclaim)."
    )
    failed_upload_grace_seconds: float = Field(
        24 * 3600, ge=0, description="A failed upload's chunks and output are kept this long."
    )
    version_keep_count: int = Field(
        2, ge=1, description="Newest content versions of a file kept (the current one counts)."
    )
    version_keep_days: float = Field(
        7.0, ge=0, description="Superseded versions younger than this are kept (0: count only)."
    )
    orphan_grace_seconds: float = Field(
        24 * 3600, gt=0, description="Blobs no row refers to are deleted once this old."
    )
    temp_grace_seconds: float = Field(
        3600,
        gt=0,
        description="Temp files (a killed merge's *.merge-tmp) are deleted, and unfinished S3"
        " multipart uploads of merges aborted, once this old; longer than any live write.",
    )
    trash_retention_days: float = Field(
        30.0,
        ge=0,
        description="Deleted items are purged this long after their deletion (their versions'"
        " bytes reclaimed, their quota released).",
    )
    trash_purge_interval_seconds: float = Field(
        3600.0, gt=0, description="How often the upload.purge_trash job runs (periodic)."
    )
    change_log_retention_days: float = Field(
        30.0,
        gt=0,
        description="ListChanges' log keeps changes this long; an older cursor is"
        " FAILED_PRECONDITION / CURSOR_EXPIRED (the client enumerates again).",
    )
    change_log_purge_interval_seconds: float = Field(
        3600.0, gt=0, description="How often the upload.purge_changes job runs (periodic)."
    )
    change_wait_max_ms: int = Field(
        60_000, ge=0, description="Longest ListChanges wait_ms honoured (a long poll)."
    )
    change_wait_max_waiters: int = Field(
        500,
        ge=1,
        description="ListChanges calls that may wait at once on a replica (each holds an RPC);"
        " past it a waiting call is RESOURCE_EXHAUSTED / CHANGE_WAITER_LIMIT.",
    )
    change_wait_recheck_ms: int = Field(
        250,
        gt=0,
        description="While a ListChanges waits, the log is re-read this often for changes"
        " committed by another replica (this replica's own wake waiters at once).",
    )
    worker_lease_seconds: float = Field(
        10.0,
        gt=0,
        description="A job whose worker died is re-run after this long (heartbeats renew it"
        " every third of it; short so a killed merge resumes within seconds).",
    )
    worker_poll_seconds: float = Field(
        0.5, gt=0, description="Idle workers look for jobs this often."
    )
    metrics_sample_seconds: float = Field(
        15.0, gt=0, description="How often the queue and upload-status gauges are re-read."
    )
    audit_sample_size: int = Field(20, ge=0, description="Completed files re-hashed per audit.")
    publish_events: bool = Field(
        True, description="Relay outbox events to the notify service's Ingest at notify_address."
    )

    # The tus 1.0 endpoint (services/upload/tus/): HTTP beside the gRPC server, same process.
    tus_enabled: bool = Field(
        False, description="Serve the tus 1.0 resumable-upload endpoint (HTTP) on tus_port."
    )
    tus_port: int = Field(
        1080, ge=0, description="Port of the tus endpoint (bind_host; 1080 is tusd's default)."
    )
    tus_path: str = Field(
        "/files/",
        pattern=r"^/([A-Za-z0-9._~-]+/)*$",
        description="URL path of the tus creation endpoint; uploads live under it.",
    )
    tus_chunk_size: int = Field(
        8 * MIB,
        ge=1,
        description="Serentak chunk size of tus uploads (<= max_chunk_size): bytes are stored"
        " as chunks of this size; a PATCH ending inside one keeps the rest staged on disk.",
    )
    tus_dir: Path | None = Field(
        None,
        description="Where the tus endpoint stages the bytes of a chunk not yet complete"
        " (fsynced); default data_dir/tus.",
    )
    tus_cors_origins: str = Field(
        "",
        description="Browser origins allowed to call the tus endpoint, comma-separated (`*`:"
        " any; bearer tokens, no cookies); empty: no CORS headers.",
    )
    tus_lock_wait_seconds: float = Field(
        10.0,
        gt=0,
        description="How long a tus request waits for another request of the same upload to"
        " finish before answering 423 Locked.",
    )

    @field_validator("blob_url")
    @classmethod
    def _known_blob_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme == "file" and parts.path:
            return value
        if parts.scheme == "s3" and parts.netloc:
            return value
        raise ValueError("blob_url must be file:///absolute/path or s3://bucket[/prefix]")

    @field_validator("s3_ca_file", mode="before")
    @classmethod
    def _s3_ca_empty_is_unset(cls, value: object) -> object:
        # A rendered template's `NAME=` (no private CA) means unset, not the current folder.
        return None if value == "" else value

    @property
    def max_message_bytes(self) -> int:
        """Largest request the upload service accepts: a full chunk plus its envelope."""
        return self.upload_max_message_bytes or self.max_chunk_size + MIB

    @property
    def tus_root(self) -> Path:
        """Where the tus endpoint stages incomplete chunks (tus_dir, else data_dir/tus)."""
        return self.tus_dir or (self.data_dir / "tus")

    @property
    def database_url(self) -> str:
        """The configured database, or the embedded SQLite default."""
        return self.upload_database_url or sqlite_url(self.data_dir, "upload")

    @property
    def blob_root(self) -> Path:
        """Where the local blob store keeps its objects (a file:// blob_url wins)."""
        if self.blob_url and urlsplit(self.blob_url).scheme == "file":
            return Path(urlsplit(self.blob_url).path)
        return self.blob_dir or (self.data_dir / "blobs")

    @property
    def blob_backend(self) -> str:
        """ "s3" or "local", from blob_url."""
        if self.blob_url and urlsplit(self.blob_url).scheme == "s3":
            return "s3"
        return "local"
