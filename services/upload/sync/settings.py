"""Settings of the upstream sync engine, read once at start-up from `SERENTAK_SYNC_*`."""

from __future__ import annotations

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DAY_SECONDS = 24 * 3600
# Known to everyone who reads this file: accepted only in dev auth mode (`make run`).
DEV_CLIENT_STATE = "dev-sync-client-state"


class SyncSettings(BaseSettings):
    """The sync engine's knobs; the upload service loads this next to `UploadSettings`."""

    model_config = SettingsConfigDict(env_prefix="SERENTAK_SYNC_", frozen=True, extra="ignore")

    enabled: bool = Field(True, description="Run the sync jobs, webhook server and periodic polls.")
    provider_base_url: str = Field(
        "https://graph.microsoft.com/v1.0", description="Graph-style API root (no trailing /)."
    )
    # One credential per tenant (JSON object in SERENTAK_SYNC_PROVIDER_TOKENS, e.g.
    # '{"acme": "..."}'): a tenant's sync calls carry only its own token, and a tenant with
    # none cannot link anything (FAILED_PRECONDITION / SYNC_PROVIDER_NOT_CONFIGURED).
    provider_tokens: dict[str, SecretStr] = Field(
        default_factory=dict, description="Tenant id -> bearer token sent to the provider."
    )
    provider_timeout_seconds: float = Field(10.0, gt=0, description="Per upstream HTTP call.")
    webhook_host: str = Field("127.0.0.1", description="Interface of the webhook endpoint.")
    # 8181: next to the service ports, clear of 8080/8081 that dev tools like to take.
    webhook_port: int = Field(8181, ge=0, description="Port of the webhook endpoint (0: any).")
    webhook_path: str = Field("/webhooks/graph", description="Path the provider posts to.")
    client_state: str = Field(
        DEV_CLIENT_STATE,
        description="Shared secret echoed in every notification (the default: dev auth only).",
    )
    # Subscriptions need the provider to reach us: the public origin of the webhook
    # listener (behind its TLS ingress). Empty: no subscriptions, polling only.
    webhook_public_url: str = Field(
        "", description="Public origin of the webhook endpoint, e.g. https://sync.example.com."
    )
    webhook_lifecycle_path: str = Field(
        "/webhooks/graph/lifecycle", description="Path of lifecycle notifications."
    )
    subscription_lifetime_seconds: float = Field(
        3 * DAY_SECONDS, gt=0, description="Expiry asked for on create/renew (Graph caps it)."
    )
    subscription_renew_before_seconds: float = Field(
        DAY_SECONDS, gt=0, description="Renew a subscription this long before it expires."
    )
    subscription_interval_seconds: float = Field(
        3600.0, gt=0, description="Period of the job that creates and renews subscriptions."
    )
    max_not_found_retries: int = Field(5, ge=0, description="404s tolerated before dead-letter.")
    not_found_backoff_base_seconds: float = Field(
        2.0, ge=0, description="First 404 backoff ceiling; doubles per retry (full jitter)."
    )
    not_found_backoff_cap_seconds: float = Field(600.0, ge=0, description="Largest 404 backoff.")
    transient_max_attempts: int = Field(
        8, ge=1, description="Attempts of one sync job on 429/5xx/timeouts before dead-letter."
    )
    transient_backoff_base_seconds: float = Field(1.0, ge=0, description="Transient backoff base.")
    transient_backoff_cap_seconds: float = Field(300.0, ge=0, description="Caps Retry-After too.")
    webhook_dedupe_seconds: float = Field(
        5.0, ge=0, description="Delta polls requested inside this window collapse into one."
    )
    reconcile_interval_seconds: float = Field(
        900.0, gt=0, description="Periodic delta poll of every drive (providers drop webhooks)."
    )
    retention_seconds: float = Field(
        30 * DAY_SECONDS, ge=0, description="Tombstones older than this are purged."
    )
    purge_interval_seconds: float = Field(3600.0, gt=0, description="Purge job period.")
    purge_batch_size: int = Field(500, ge=1, description="Tombstones purged per transaction.")
    max_delta_pages: int = Field(10_000, ge=1, description="Guard against a next-link loop.")

    @model_validator(mode="after")
    def _renewals_in_time(self) -> SyncSettings:
        # A check every interval must see a subscription while it is still renewable.
        if self.subscription_renew_before_seconds <= self.subscription_interval_seconds:
            raise ValueError("subscription_renew_before_seconds must exceed the interval")
        if self.subscription_lifetime_seconds <= self.subscription_renew_before_seconds:
            raise ValueError("subscription_lifetime_seconds must exceed renew_before")
        if self.webhook_lifecycle_path == self.webhook_path:
            # One route would shadow the other: lifecycle events would read as changes.
            raise ValueError("webhook_lifecycle_path must differ from webhook_path")
        return self

    @property
    def subscriptions_enabled(self) -> bool:
        """True when the provider can be told where to post (a public webhook URL)."""
        return self.enabled and bool(self.webhook_public_url)

    def provider_configured(self, tenant_id: str) -> bool:
        """True when `tenant_id` has a provider credential (and there is a provider URL)."""
        token = self.provider_tokens.get(tenant_id)
        return bool(self.provider_base_url and token is not None and token.get_secret_value())
