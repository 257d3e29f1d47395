"""A Graph-style HTTP provider (OneDrive/SharePoint shape) over httpx.

Endpoints used: `GET {base}/drives/{drive}/items/{item}` and
`GET {base}/drives/{drive}/root/delta` (then the returned `@odata.nextLink` /
`@odata.deltaLink` URLs verbatim, but only on the base URL's own origin: a link to any
other scheme, host or port is refused unfetched with `ForeignLink`, so a provider answer
can never aim our bearer token, or a request from inside our network, elsewhere);
`POST {base}/subscriptions`, `PATCH` and `DELETE {base}/subscriptions/{id}` for change
subscriptions. Each call carries the calling tenant's own token. Every call is counted
by status in metrics.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx

from services.upload.sync import metrics
from services.upload.sync.decisions import parse_retry_after
from services.upload.sync.provider import (
    DeltaPage,
    ForeignLink,
    NoCredential,
    Subscription,
    UpstreamError,
    UpstreamItem,
    UpstreamTimeout,
    WebhookRefused,
)


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def item_from_json(body: Mapping[str, Any]) -> UpstreamItem:
    """An UpstreamItem from a Graph driveItem (`deleted` facet or `@removed`: removed)."""
    expires = body.get("expirationDateTime")
    if expires is None and isinstance(body.get("retention"), Mapping):
        expires = body["retention"].get("expiresDateTime")
    return UpstreamItem(
        id=str(body["id"]),
        name=str(body.get("name", "")),
        size=int(body.get("size") or 0),
        etag=str(body.get("eTag", "")),
        modified_at=_parse_time(body.get("lastModifiedDateTime")),
        expires_at=_parse_time(expires),
        removed="@removed" in body or "deleted" in body,
    )


def _iso(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def _subscription(body: Mapping[str, Any]) -> Subscription:
    """A Subscription from a Graph subscription resource (502 without a usable id)."""
    sub_id = body.get("id")
    if not isinstance(sub_id, str) or not sub_id or len(sub_id) > 255:
        raise UpstreamError(502, "subscription answer has no usable id")
    return Subscription(id=sub_id, expires_at=_parse_time(body.get("expirationDateTime")))


def drive_of(resource: str) -> str | None:
    # "drives/{id}/root" or "/drives/{id}/items/..." -> {id}
    parts = [p for p in resource.split("/") if p]
    for i, part in enumerate(parts[:-1]):
        if part.lower() == "drives":
            return parts[i + 1]
    return None


_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> tuple[str, str, int | None] | None:
    """(scheme, host, port) of an absolute URL, default ports filled in; None if unparsable."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return None
    scheme = parsed.scheme.lower()
    if not scheme or not parsed.host:
        return None
    return (scheme, parsed.host.lower(), parsed.port or _DEFAULT_PORTS.get(scheme))


class GraphProvider:
    """`Provider` over HTTP; one pooled httpx client per instance, a token per tenant."""

    def __init__(
        self,
        base_url: str,
        tokens: Mapping[str, str],
        *,
        timeout_seconds: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._origin = origin(self.base_url)
        self._tokens = {tenant: token for tenant, token in tokens.items() if token}
        self._client = httpx.AsyncClient(
            headers={"Accept": "application/json"}, timeout=timeout_seconds, transport=transport
        )

    def _own(self, url: str) -> str:
        """`url` if it is on the provider's origin; else ForeignLink (never fetched)."""
        if self._origin is None or origin(url) != self._origin:
            raise ForeignLink(url)
        return url

    async def _get(self, operation: str, tenant_id: str, url: str) -> dict[str, Any]:
        return await self._call("GET", operation, tenant_id, url)

    async def _call(
        self,
        method: str,
        operation: str,
        tenant_id: str,
        url: str,
        body: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        token = self._tokens.get(tenant_id)
        if token is None:
            metrics.UPSTREAM_CALLS.labels(operation, "no_credential").inc()
            raise NoCredential(tenant_id)
        try:
            response = await self._client.request(
                method,
                self._own(url),
                headers={"Authorization": f"Bearer {token}"},
                json=body,
            )
        except httpx.TimeoutException as exc:
            metrics.UPSTREAM_CALLS.labels(operation, "timeout").inc()
            raise UpstreamTimeout(f"{operation} timed out", url=url) from exc
        except httpx.TransportError as exc:
            metrics.UPSTREAM_CALLS.labels(operation, "unreachable").inc()
            raise UpstreamError(0, f"{operation}: {exc!r}", url=url) from exc
        metrics.UPSTREAM_CALLS.labels(operation, str(response.status_code)).inc()
        if response.status_code >= 300:
            raise UpstreamError(
                response.status_code,
                f"{operation}: {response.text[:200]}",
                retry_after=parse_retry_after(response.headers.get("Retry-After")),
                url=url,
            )
        if method == "DELETE" and response.status_code == 204:
            return {}  # No Content is the answer to a delete
        try:
            body = response.json()
        except ValueError as exc:
            # A 2xx we cannot read is the provider misbehaving: retry like a 5xx.
            raise UpstreamError(502, f"{operation}: body is not JSON", url=url) from exc
        if not isinstance(body, dict):
            raise UpstreamError(502, f"{operation}: body is not a JSON object", url=url)
        return body

    async def get_item(self, tenant_id: str, drive_id: str, item_id: str) -> UpstreamItem:
        """GET one driveItem with the tenant's token."""
        url = f"{self.base_url}/drives/{quote(drive_id, safe='')}/items/{quote(item_id, safe='')}"
        return item_from_json(await self._get("get_item", tenant_id, url))

    async def delta_page(self, tenant_id: str, drive_id: str, cursor: str | None) -> DeltaPage:
        """GET one delta page: from `cursor` (a link the provider gave us) or from scratch.

        Links in the answer are checked here, before anyone stores or follows them.
        """
        url = cursor or f"{self.base_url}/drives/{quote(drive_id, safe='')}/root/delta"
        body = await self._get("delta", tenant_id, url)
        values = body.get("value") or []
        next_link, delta_link = body.get("@odata.nextLink"), body.get("@odata.deltaLink")
        return DeltaPage(
            items=[item_from_json(v) for v in values if isinstance(v, Mapping) and "id" in v],
            next_link=self._own(next_link) if next_link else None,
            delta_link=self._own(delta_link) if delta_link else None,
        )

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
        """POST /subscriptions for the drive's root (changeType updated)."""
        body = await self._call(
            "POST",
            "subscribe",
            tenant_id,
            f"{self.base_url}/subscriptions",
            {
                "changeType": "updated",
                "resource": f"drives/{quote(drive_id, safe='')}/root",
                "notificationUrl": notification_url,
                "lifecycleNotificationUrl": lifecycle_url,
                "clientState": client_state,
                "expirationDateTime": _iso(expires_at),
            },
        )
        return _subscription(body)

    async def renew_subscription(
        self, tenant_id: str, subscription_id: str, expires_at: datetime
    ) -> Subscription:
        """PATCH /subscriptions/{id} with a new expirationDateTime."""
        body = await self._call(
            "PATCH",
            "renew",
            tenant_id,
            f"{self.base_url}/subscriptions/{quote(subscription_id, safe='')}",
            {"expirationDateTime": _iso(expires_at)},
        )
        return _subscription(body)

    async def delete_subscription(self, tenant_id: str, subscription_id: str) -> None:
        """DELETE /subscriptions/{id} (UpstreamError 404 if the provider has none)."""
        await self._call(
            "DELETE",
            "unsubscribe",
            tenant_id,
            f"{self.base_url}/subscriptions/{quote(subscription_id, safe='')}",
        )

    def notified_drives(self, payload: Mapping[str, Any], client_state: str) -> list[str]:
        """Drive ids named by a change notification batch; refuses a bad clientState.

        The body is never trusted as state: it only says which drives to poll.
        """
        notifications = payload.get("value")
        if not isinstance(notifications, list) or not notifications:
            raise WebhookRefused("notification body has no 'value' list")
        drives: list[str] = []
        for n in notifications:
            if not isinstance(n, Mapping):
                raise WebhookRefused("notification is not an object")
            given = n.get("clientState")
            if not isinstance(given, str) or not hmac.compare_digest(
                given.encode(), client_state.encode()
            ):
                raise WebhookRefused("clientState does not match", status=403)
            resource = n.get("resource")
            if not isinstance(resource, str):
                raise WebhookRefused("notification resource is not a string")
            drive = drive_of(resource)
            if drive is None:
                raise WebhookRefused("notification resource names no drive")
            if drive not in drives:
                drives.append(drive)
        return drives

    async def aclose(self) -> None:
        """Close the pooled connections."""
        await self._client.aclose()
