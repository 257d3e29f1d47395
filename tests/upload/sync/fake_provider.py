"""A fake Graph-style provider: a real aiohttp server on 127.0.0.1 with scripted answers.

- Items: `put_item(drive, item, **fields)`; `script(drive, item, 404, 404, 200)` queues
  statuses answered before falling back to the item (or `forever=` a status).
- Delta: `set_delta(drive, token, pages, next_token)` serves `pages` from `token` ("" is
  a full enumeration) chained by @odata.nextLink, the last one with an @odata.deltaLink
  for `next_token`; `expire(drive, token)` answers 410 for that cursor.
- `hold(drive, item)` parks GETs of that item until the test releases them.
- `set_page(drive, token, body)` serves any body for a cursor (e.g. a foreign nextLink).
- Subscriptions: `POST /subscriptions`, `PATCH` and `DELETE /subscriptions/{id}` keep them in
  `subscriptions` (id -> the posted body, expiry updated); `fail_subscriptions(503, ...)`
  queues error answers for the next subscription calls; `drop_subscription(id)` forgets
  one (a renewal then 404s); `emit_lifecycle(id, event)` / `emit_change(id)` POST a
  notification to the URL the subscription names, with its clientState (or `client_state`).
- Every request lands in `calls` with a monotonic timestamp and its bearer token.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientSession, web


def _bearer(request: web.Request) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" else ""


@dataclass(frozen=True)
class Call:
    """One request the fake received."""

    kind: str  # "item", "delta", "subscribe", "renew" or "unsubscribe"
    drive: str
    key: str  # item id or delta token
    at: float
    token: str = ""  # the bearer token the request carried


@dataclass
class Held:
    """A parked item: `arrived` is set when a GET reaches it, `release` lets it answer."""

    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Scripted:
    """One scripted answer."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)


class FakeProvider:
    """Start with `await fake.start()` (or `async with FakeProvider() as fake:`, which also
    stops it); `base_url` then points at it."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        self.scripts: dict[tuple[str, str], deque[Scripted]] = defaultdict(deque)
        self.forever: dict[tuple[str, str], Scripted] = {}
        self.delta: dict[tuple[str, str], dict[str, Any] | Scripted] = {}
        self.calls: list[Call] = []
        self.held: dict[tuple[str, str], Held] = {}
        self.base_url = ""
        self.subscriptions: dict[str, dict[str, Any]] = {}
        self.subscription_failures: deque[Scripted] = deque()
        self._next_sub = 0
        self._runner: web.AppRunner | None = None

    # -- scripting -------------------------------------------------------------------
    def put_item(self, drive: str, item: str, **fields: Any) -> dict[str, Any]:
        """Serve `item` with these driveItem fields (id and name filled in)."""
        body = {"id": item, "name": f"{item}.txt", "size": 3, "eTag": f"e-{item}", **fields}
        self.items[(drive, item)] = body
        return body

    def script(self, drive: str, item: str, *statuses: int, **headers: str) -> None:
        """Answer these statuses first, in order (headers such as Retry_After on each)."""
        hdrs = {k.replace("_", "-"): v for k, v in headers.items()}
        for status in statuses:
            self.scripts[(drive, item)].append(Scripted(status, hdrs))

    def always(self, drive: str, item: str, status: int) -> None:
        """Answer `status` for the item from now on."""
        self.forever[(drive, item)] = Scripted(status)

    def hold(self, drive: str, item: str) -> Held:
        """Park GETs of `item` until `release` is set."""
        held = self.held[(drive, item)] = Held()
        return held

    def set_delta(
        self, drive: str, token: str, pages: list[list[dict[str, Any]]], next_token: str
    ) -> None:
        """Serve `pages` from cursor `token`, ending with a deltaLink for `next_token`."""
        for i, page in enumerate(pages):
            key = token if i == 0 else f"{token}~p{i}"
            body: dict[str, Any] = {"value": page}
            if i + 1 < len(pages):
                body["@odata.nextLink"] = self.delta_url(drive, f"{token}~p{i + 1}")
            else:
                body["@odata.deltaLink"] = self.delta_url(drive, next_token)
            self.delta[(drive, key)] = body

    def set_page(self, drive: str, token: str, body: dict[str, Any]) -> None:
        """Serve `body` verbatim for cursor `token`."""
        self.delta[(drive, token)] = body

    def expire(self, drive: str, token: str) -> None:
        """The cursor `token` answers 410 Gone (expired)."""
        self.delta[(drive, token)] = Scripted(410)

    def delta_url(self, drive: str, token: str) -> str:
        """The link the fake hands out for cursor `token`."""
        return f"{self.base_url}/drives/{drive}/root/delta?token={token}"

    def fail_subscriptions(self, *statuses: int, **headers: str) -> None:
        """Answer these statuses to the next subscription creates/renewals, in order."""
        hdrs = {k.replace("_", "-"): v for k, v in headers.items()}
        self.subscription_failures.extend(Scripted(s, hdrs) for s in statuses)

    def drop_subscription(self, sub_id: str) -> None:
        """Forget a subscription (as the provider does when it removes one)."""
        self.subscriptions.pop(sub_id, None)

    def subscription_for(self, drive: str) -> dict[str, Any]:
        """The one live subscription on `drive`'s root."""
        (found,) = [
            s for s in self.subscriptions.values() if s["resource"] == f"drives/{drive}/root"
        ]
        return found

    async def emit_lifecycle(
        self, sub_id: str, event: str, *, client_state: str | None = None
    ) -> int:
        """POST a lifecycle notification for `sub_id`; the webhook's status code."""
        sub = self.subscriptions[sub_id]
        entry = {
            "subscriptionId": sub_id,
            "lifecycleEvent": event,
            "resource": sub["resource"],
            "subscriptionExpirationDateTime": sub["expirationDateTime"],
            "clientState": sub["clientState"] if client_state is None else client_state,
        }
        return await self._post(sub["lifecycleNotificationUrl"], {"value": [entry]})

    async def emit_change(self, sub_id: str) -> int:
        """POST a change notification for `sub_id`; the webhook's status code."""
        sub = self.subscriptions[sub_id]
        entry = {
            "subscriptionId": sub_id,
            "changeType": "updated",
            "resource": sub["resource"],
            "clientState": sub["clientState"],
        }
        return await self._post(sub["notificationUrl"], {"value": [entry]})

    async def _post(self, url: str, body: dict[str, Any]) -> int:
        async with ClientSession() as session, session.post(url, json=body) as response:
            return response.status

    # -- inspection ------------------------------------------------------------------
    def item_calls(self, drive: str, item: str) -> list[Call]:
        """GETs of one item, in order."""
        return [c for c in self.calls if c.kind == "item" and (c.drive, c.key) == (drive, item)]

    def delta_calls(self, drive: str) -> list[Call]:
        """Delta requests for one drive, in order."""
        return [c for c in self.calls if c.kind == "delta" and c.drive == drive]

    # -- server ----------------------------------------------------------------------
    async def _item(self, request: web.Request) -> web.Response:
        drive, item = request.match_info["drive"], request.match_info["item"]
        self.calls.append(Call("item", drive, item, time.monotonic(), _bearer(request)))
        held = self.held.get((drive, item))
        if held is not None:
            held.arrived.set()
            await held.release.wait()
        queue = self.scripts.get((drive, item))
        answer = queue.popleft() if queue else self.forever.get((drive, item))
        if answer is not None and answer.status != 200:
            return web.json_response(
                {"error": {"code": str(answer.status)}},
                status=answer.status,
                headers=answer.headers,
            )
        body = self.items.get((drive, item))
        if body is None:
            return web.json_response({"error": {"code": "itemNotFound"}}, status=404)
        return web.json_response(body)

    async def _delta(self, request: web.Request) -> web.Response:
        drive = request.match_info["drive"]
        token = request.query.get("token", "")
        self.calls.append(Call("delta", drive, token, time.monotonic(), _bearer(request)))
        answer = self.delta.get((drive, token))
        if answer is None:
            return web.json_response({"error": {"code": "unknownCursor"}}, status=400)
        if isinstance(answer, Scripted):
            return web.json_response(
                {"error": {"code": "resyncRequired"}},
                status=answer.status,
                headers=answer.headers,
            )
        return web.json_response(answer)

    async def _subscription_failure(self) -> web.Response | None:
        if not self.subscription_failures:
            return None
        answer = self.subscription_failures.popleft()
        return web.json_response(
            {"error": {"code": str(answer.status)}}, status=answer.status, headers=answer.headers
        )

    async def _subscribe(self, request: web.Request) -> web.Response:
        body = await request.json()
        drive = str(body.get("resource", "")).split("/")[1:2]
        self.calls.append(
            Call("subscribe", drive[0] if drive else "", "", time.monotonic(), _bearer(request))
        )
        failure = await self._subscription_failure()
        if failure is not None:
            return failure
        self._next_sub += 1
        sub = {**body, "id": f"sub-{self._next_sub}"}
        self.subscriptions[sub["id"]] = sub
        return web.json_response(sub, status=201)

    async def _renew(self, request: web.Request) -> web.Response:
        sub_id = request.match_info["sub"]
        body = await request.json()
        sub = self.subscriptions.get(sub_id)
        drive = str(sub["resource"]).split("/")[1] if sub else ""
        self.calls.append(Call("renew", drive, sub_id, time.monotonic(), _bearer(request)))
        failure = await self._subscription_failure()
        if failure is not None:
            return failure
        if sub is None:
            return web.json_response({"error": {"code": "itemNotFound"}}, status=404)
        sub["expirationDateTime"] = body["expirationDateTime"]
        return web.json_response(sub)

    async def _unsubscribe(self, request: web.Request) -> web.Response:
        sub_id = request.match_info["sub"]
        sub = self.subscriptions.pop(sub_id, None)
        drive = str(sub["resource"]).split("/")[1] if sub else ""
        self.calls.append(Call("unsubscribe", drive, sub_id, time.monotonic(), _bearer(request)))
        if sub is None:
            return web.json_response({"error": {"code": "itemNotFound"}}, status=404)
        return web.Response(status=204)

    async def start(self) -> None:
        """Serve on 127.0.0.1, any free port."""
        app = web.Application()
        app.router.add_get("/drives/{drive}/items/{item}", self._item)
        app.router.add_get("/drives/{drive}/root/delta", self._delta)
        app.router.add_post("/subscriptions", self._subscribe)
        app.router.add_patch("/subscriptions/{sub}", self._renew)
        app.router.add_delete("/subscriptions/{sub}", self._unsubscribe)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base_url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        """Shut the server down."""
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> FakeProvider:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
