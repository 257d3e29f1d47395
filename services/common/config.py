"""Settings, read once from the environment (`SERENTAK_*`) into frozen objects.

Nothing else in the code base reads the environment: a service calls `load()` for its
settings class once at start-up and passes the object down.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from serentak.errors import ConfigError as ConfigError
from serentak.settings import DEFAULT_SERVICE_TOKENS

DEFAULT_DATA_DIR = Path(".data")
DAY_SECONDS = 24 * 3600

# Dev-mode identities: bearer token -> tenant and user. Production replaces this table.
DEFAULT_AUTH_TOKENS: dict[str, dict[str, str]] = {
    "dev-alice": {"tenant_id": "acme", "user_id": "alice"},
    "dev-bob": {"tenant_id": "acme", "user_id": "bob"},
    "dev-carol": {"tenant_id": "acme", "user_id": "carol"},
    "dev-mallory": {"tenant_id": "evil", "user_id": "mallory"},
}
# Dev-mode service principals (token -> principal, `ops` the operator role): the client
# package's table (serentak.settings), which its command line reads too.
# ConfigError (settings that cannot work together; the service refuses to start and says
# why) is the client package's, so a bad address refused by serentak.channels is one too.


class CommonSettings(BaseSettings):
    """Settings every service reads; each service extends this class with its own."""

    model_config = SettingsConfigDict(env_prefix="SERENTAK_", frozen=True, extra="ignore")

    data_dir: Path = Field(DEFAULT_DATA_DIR, description="Folder for SQLite files and blobs.")
    bind_host: str = Field("127.0.0.1", description="Interface the gRPC servers listen on.")
    upload_port: int = 50051
    locks_port: int = 50052
    notify_port: int = 50053
    upload_metrics_port: int = 9101
    locks_metrics_port: int = 9102
    notify_metrics_port: int = 9103
    health_port: int = Field(
        0, ge=0, description="Plaintext port serving only gRPC Health (kubelet probes); 0: off."
    )
    upload_address: str = "127.0.0.1:50051"
    locks_address: str = "127.0.0.1:50052"
    notify_address: str = "127.0.0.1:50053"
    etcd_endpoint: str = Field(
        "127.0.0.1:2379", description="host:port of one etcd member (when etcd_endpoints is empty)."
    )
    etcd_endpoints: str = Field(
        "",
        description="Comma list of etcd members, host:port (DNS names or IPs; https:// for TLS).",
    )
    etcd_ca_file: Path | None = Field(None, description="CA bundle for etcd TLS (enables TLS).")
    etcd_cert_file: Path | None = Field(None, description="Client certificate for etcd (mTLS).")
    etcd_key_file: Path | None = Field(None, description="Client key for etcd (mTLS).")
    etcd_username: str | None = Field(None, description="etcd auth user (token refreshed).")
    etcd_password: SecretStr | None = Field(None, description="etcd auth password.")
    etcd_prefer_first_endpoint: bool = Field(
        False, description="Use the first etcd endpoint while it answers, not a random one."
    )
    etcd_keepalive_seconds: float = Field(
        10.0, ge=5, description="gRPC keepalive ping interval to etcd (etcd allows >= 5 s)."
    )
    log_format: Literal["json", "console"] = "json"
    log_level: str = "INFO"
    shutdown_grace_seconds: float = Field(5.0, ge=0, description="In-flight calls get this long.")
    # Server limits (services/common/server_limits.py); message sizes are per service.
    max_concurrent_rpcs: int = Field(
        1000,
        ge=1,
        description="Calls one server runs at once (streams count); more: RESOURCE_EXHAUSTED. "
        "Notify: users' calls other than streams (streams and service calls have caps of "
        "their own).",
    )
    keepalive_time_seconds: float = Field(60, gt=0, description="Server pings idle connections.")
    keepalive_timeout_seconds: float = Field(20, gt=0, description="Unanswered ping: drop it.")
    # Below the 30 s our own clients ping at (channels.py), with room for jitter.
    min_client_ping_interval_seconds: float = Field(
        20, ge=0, description="Client pings closer than this are strikes (GOAWAY after the last)."
    )
    max_ping_strikes: int = Field(2, ge=0, description="Strikes before too_many_pings GOAWAY.")
    max_connection_idle_seconds: float = Field(
        300, gt=0, description="Close call-less connections."
    )
    auth_tokens: dict[str, dict[str, str]] = Field(
        default_factory=lambda: dict(DEFAULT_AUTH_TOKENS)
    )
    page_token_secret: SecretStr = Field(
        default_factory=lambda: SecretStr(secrets.token_urlsafe(32)),
        min_length=16,
        description="HMAC key of page tokens; replicas must share it (default: random).",
    )
    readiness_interval_seconds: float = Field(
        5.0, gt=0, description="How often dependencies are probed for health readiness."
    )
    readiness_timeout_seconds: float = Field(
        3.0, gt=0, description="A dependency probe slower than this counts as down."
    )
    migrate_on_start: bool = Field(
        False,
        description="Upgrade the database schema at start-up (make run, tests). Production: "
        "false, and run `serentak-migrate` as a deployment step; a replica then refuses to "
        "start on a schema older than its code.",
    )
    # --- Trust boundary (README "Running it for real"). No default mode: a service with
    # none refuses to start; `make run` and the test helpers say `dev` explicitly. Outside
    # dev, known dev secrets (e.g. the sync webhook's default clientState) are refused.
    auth_mode: Literal["dev", "jwt"] | None = Field(
        None, description="dev: the token tables below, loopback only; jwt: bearer JWTs."
    )
    auth_service_tokens: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_SERVICE_TOKENS),
        description="dev mode: bearer token -> service principal (upload|notify|locks|ops).",
    )
    auth_jwks_url: str | None = Field(None, description="jwt mode: where the signing keys are.")
    auth_jwt_issuer: str | None = Field(None, description="jwt mode: required `iss`.")
    auth_jwt_audience: str | None = Field(None, description="jwt mode: required `aud`.")
    auth_jwt_algorithms: list[str] = Field(
        default_factory=lambda: ["RS256", "ES256", "EdDSA"],
        description="Accepted `alg`s; `none` and HMAC (HS*) are refused at start.",
    )
    auth_jwt_leeway_seconds: float = Field(
        30.0, ge=0, le=300, description="Clock skew for exp/nbf."
    )
    auth_jwks_cache_seconds: float = Field(
        300.0, gt=0, description="Keys are re-fetched after this long (and on an unknown kid)."
    )
    auth_jwks_min_refresh_seconds: float = Field(
        5.0, ge=0, description="Unknown kids trigger at most one JWKS fetch this often."
    )
    auth_jwks_timeout_seconds: float = Field(5.0, gt=0, description="One JWKS fetch's deadline.")
    auth_jwks_ca_file: Path | None = Field(
        None,
        description="jwt mode: CA (PEM) of a JWKS URL with a private certificate, trusted with "
        "the system's roots; read at start (empty: the system's roots only).",
    )
    auth_claim_tenant: str = Field("tenant_id", description="Claim carrying the user's tenant.")
    auth_claim_user: str = Field("sub", description="Claim carrying the user id.")
    auth_claim_roles: str = Field("roles", description="Claim carrying a list of roles.")
    auth_claim_client: str = Field("client_id", description="Claim naming the OAuth client.")
    auth_service_clients: dict[str, str] = Field(
        default_factory=dict,
        description="jwt mode: client id (auth_claim_client) -> service principal.",
    )
    auth_mtls_principals: dict[str, str] = Field(
        default_factory=dict,
        description="Client certificate identity (SAN DNS/URI or CN) -> service principal.",
    )
    client_token: str | None = Field(
        None, description="jwt mode: this service's own bearer token (client credentials)."
    )
    client_token_file: Path | None = Field(
        None, description="jwt mode: file holding this service's token; re-read when it changes."
    )
    tls_cert_file: Path | None = Field(None, description="Server certificate chain (PEM).")
    tls_key_file: Path | None = Field(None, description="Server private key (PEM).")
    tls_client_ca_file: Path | None = Field(
        None, description="CA for client certificates: set it and clients must present one."
    )
    tls_ca_file: Path | None = Field(None, description="Clients: CA that signed the servers.")
    tls_client_cert_file: Path | None = Field(None, description="Clients: certificate (mTLS).")
    tls_client_key_file: Path | None = Field(None, description="Clients: private key (mTLS).")
    # A list of addresses (10.0.0.1:50052,10.0.0.2:50052) is no host name a certificate can
    # carry: over TLS the name the replicas' certificates share is verified instead.
    upload_tls_server_name: str = Field(
        "",
        description="Clients: name upload's certificates carry, verified instead of the address.",
    )
    locks_tls_server_name: str = Field(
        "",
        description="Clients: name locks' certificates carry (e.g. locks.serentak.internal), "
        "verified instead of the address; needed for a list of IPs over TLS.",
    )
    notify_tls_server_name: str = Field(
        "",
        description="Clients: name notify's certificates carry (e.g. notify.serentak.internal), "
        "verified instead of the address; needed for a list of IPs over TLS.",
    )
    malloc_retain_bytes: int = Field(
        256 * 1024 * 1024,
        ge=0,
        le=2**31 - 1,
        description="Freed memory a process keeps for reuse (glibc; 0: glibc's defaults).",
    )
    # Rate limits per RPC family (services/common/rate_limits/); the families and their
    # limits are each service's settings.
    rate_limit_window_seconds: float = Field(
        60.0,
        gt=0,
        description="Length of one rate limit window: each family's limits are calls (and "
        "counted stream messages) per user and per tenant in one window, over all replicas.",
    )
    rate_limit_batch_max: int = Field(
        32,
        ge=1,
        description="Most units a replica reserves from the shared count at once (a key's "
        "limit/50 when smaller): fewer store round trips, and at most this many less one "
        "left unused per replica and window.",
    )
    # OpenTelemetry traces (services/common/tracing.py): off unless an endpoint is set.
    otlp_endpoint: str | None = Field(
        None,
        description="OTLP/gRPC collector spans are exported to (http://host:4317 plaintext, "
        "https:// TLS); unset: tracing off.",
    )
    trace_service_name: str | None = Field(
        None, description="service.name of this process's spans (default: serentak-<service>)."
    )
    trace_sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of the traces this service starts that are recorded (a caller's "
        "traceparent decides for its own).",
    )
    sqlite_synchronous: Literal["FULL", "NORMAL"] = Field(
        "FULL", description="FULL: a committed transaction survives power loss, not just a crash."
    )
    # --- Retention of the job runtime's tables (services with one: upload, notify;
    # services/common/jobs/retention.py).
    outbox_retention_seconds: float = Field(
        7 * DAY_SECONDS,
        ge=0,
        description="Published outbox events older than this are purged (unpublished ones "
        "never are).",
    )
    applied_jobs_retention_seconds: float = Field(
        30 * DAY_SECONDS,
        ge=0,
        description="Applied-job records (idempotency keys) older than this are purged; keep "
        "it longer than any redelivery or replay window (at least dead_letter_retention_seconds).",
    )
    dead_letter_retention_seconds: float = Field(
        30 * DAY_SECONDS, ge=0, description="Dead letters older than this are purged."
    )
    audit_retention_seconds: float = Field(
        365 * DAY_SECONDS, ge=0, description="Audit trail rows older than this are purged."
    )
    runtime_retention_interval_seconds: float = Field(
        3600.0, gt=0, description="How often the runtime_retention job runs (periodic schedule)."
    )

    @field_validator("auth_jwks_ca_file", mode="before")
    @classmethod
    def _jwks_ca_empty_is_unset(cls, value: object) -> object:
        # A rendered template's `NAME=` (no private CA) means unset, not the current folder.
        return None if value == "" else value

    @model_validator(mode="after")
    def _replays_find_their_keys(self) -> CommonSettings:
        # A replayed dead letter passes the idempotency check only while its key is kept.
        if self.applied_jobs_retention_seconds < self.dead_letter_retention_seconds:
            raise ValueError(
                "applied_jobs_retention_seconds must be >= dead_letter_retention_seconds"
            )
        return self


SettingsT = TypeVar("SettingsT", bound=BaseSettings)


def load(cls: type[SettingsT], **overrides: object) -> SettingsT:
    """Read `cls` from the environment once; keyword overrides win (tests use them)."""
    return cls(**overrides)  # type: ignore[arg-type]


def sqlite_url(data_dir: Path, name: str) -> str:
    """The embedded default database URL for one service: `{data_dir}/{name}.db`."""
    return f"sqlite+aiosqlite:///{(data_dir / f'{name}.db').resolve()}"
