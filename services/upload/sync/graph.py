"""A Graph-style HTTP provider (OneDrive/SharePoint shape) over httpx.

Endpoints used: `GET {base}/drives/{drive}/items/{item}` and
`GET {base}/drives/{drive}/root/delta` (then the returned `@odata.nextLink` /
`@odata.deltaLink` URLs verbatim). Every call is counted by status in metrics.
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


def _drive_of(resource: str) -> str | None:
    # "drives/{id}/root" or "/drives/{id}/items/..." -> {id}
    parts = [p for p in resource.split("/") if p]
    for i, part in enumerate(parts[:-1]):
        if part.lower() == "drives":
            return parts[i + 1]
    return None


class GraphProvider:
    """`Provider` over HTTP; one pooled httpx client per instance."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout_seconds: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.base_url = base_url.rstrip("/")
        self._client = httpx.AsyncClient(
            headers=headers, timeout=timeout_seconds, transport=transport
        )

    async def _get(self, operation: str, url: str) -> dict[str, Any]:
        try:
            response = await self._client.get(url)
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
        try:
            body = response.json()
        except ValueError as exc:
            # A 2xx we cannot read is the provider misbehaving: retry like a 5xx.
            raise UpstreamError(502, f"{operation}: body is not JSON", url=url) from exc
        if not isinstance(body, dict):
            raise UpstreamError(502, f"{operation}: body is not a JSON object", url=url)
        return body

    async def get_item(self, drive_id: str, item_id: str) -> UpstreamItem:
        """GET one driveItem."""
        url = f"{self.base_url}/drives/{quote(drive_id, safe='')}/items/{quote(item_id, safe='')}"
        return item_from_json(await self._get("get_item", url))

    async def delta_page(self, drive_id: str, cursor: str | None) -> DeltaPage:
        """GET one delta page: from `cursor` (a link the provider gave us) or from scratch."""
        url = cursor or f"{self.base_url}/drives/{quote(drive_id, safe='')}/root/delta"
        body = await self._get("delta", url)
        values = body.get("value") or []
        return DeltaPage(
            items=[item_from_json(v) for v in values if isinstance(v, Mapping) and "id" in v],
            next_link=body.get("@odata.nextLink"),
            delta_link=body.get("@odata.deltaLink"),
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
            drive = _drive_of(str(n.get("resource", "")))
            if drive is None:
                raise WebhookRefused("notification resource names no drive")
            if drive not in drives:
                drives.append(drive)
        return drives

    async def aclose(self) -> None:
        """Close the pooled connections."""
        await self._client.aclose()
