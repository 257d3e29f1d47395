"""The upstream provider interface: get an item, page through a drive's delta, read webhooks.

`graph.py` implements it over HTTP (Microsoft Graph shape). Failures are typed
`UpstreamError`s carrying the HTTP status and any Retry-After, so `decisions.py` can map
them to an action without knowing about HTTP clients.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class UpstreamItem:
    """Metadata of one upstream item as the provider reports it."""

    id: str
    name: str = ""
    size: int = 0
    etag: str = ""
    modified_at: datetime | None = None
    # Retention end, when the provider announces one.
    expires_at: datetime | None = None
    # A `deleted` facet or `@removed` annotation: gone upstream.
    removed: bool = False


@dataclass(frozen=True, slots=True)
class DeltaPage:
    """One page of a drive's changes: follow `next_link`, or store `delta_link`."""

    items: list[UpstreamItem] = field(default_factory=list)
    next_link: str | None = None
    delta_link: str | None = None


@dataclass(frozen=True, slots=True)
class Subscription:
    """A change subscription the provider holds for one drive."""

    id: str
    expires_at: datetime | None = None


class UpstreamError(Exception):
    """The provider answered an error status, or could not be reached (status 0)."""

    def __init__(
        self, status: int, message: str, *, retry_after: float | None = None, url: str = ""
    ) -> None:
        super().__init__(f"upstream {status or 'unreachable'}: {message}")
        self.status = status
        self.message = message
        self.retry_after = retry_after
        self.url = str(url)


class UpstreamTimeout(UpstreamError):
    """No answer within the configured timeout."""

    def __init__(self, message: str, *, url: str = "") -> None:
        super().__init__(0, message, url=url)


class NoCredential(UpstreamError):
    """The tenant has no provider credential: nothing was sent (permanent, like a 401)."""

    def __init__(self, tenant_id: str) -> None:
        super().__init__(401, f"no provider credential for tenant {tenant_id!r}")


class ForeignLink(Exception):
    """A next/delta link off the provider's own origin: never fetched (permanent)."""

    def __init__(self, url: str) -> None:
        super().__init__(f"link leaves the provider's origin: {str(url)[:200]!r}")
        self.url = str(url)


class WebhookRefused(Exception):
    """A notification that must not be acted on (bad client state, unreadable body)."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Provider(Protocol):
    """What the sync engine needs from an upstream storage provider."""

    async def get_item(self, tenant_id: str, drive_id: str, item_id: str) -> UpstreamItem:
        """The item's metadata with the tenant's credential; UpstreamError on any non-2xx."""
        ...

    async def delta_page(self, tenant_id: str, drive_id: str, cursor: str | None) -> DeltaPage:
        """One delta page from `cursor` (a next/delta link), or a full enumeration if None.

        Raises ForeignLink, before any request, for a cursor off the provider's origin, and
        for a page whose next/delta link is.
        """
        ...

    async def create_subscription(
        self,
        tenant_id: str,
        drive_id: str,
        *,
        notification_url: str,
        lifecycle_url: str,
        client_state: str,
        expires_at: datetime,
    ) -> Subscription:
        """Subscribe to changes of the drive's root with the tenant's credential."""
        ...

    async def renew_subscription(
        self, tenant_id: str, subscription_id: str, expires_at: datetime
    ) -> Subscription:
        """Move a subscription's expiry (also how a reauthorization is answered)."""
        ...

    async def delete_subscription(self, tenant_id: str, subscription_id: str) -> None:
        """End a subscription (an unlinked drive's)."""
        ...

    def notified_drives(self, payload: Mapping[str, Any], client_state: str) -> list[str]:
        """Upstream drive ids a webhook body names; WebhookRefused on a bad client state."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...
