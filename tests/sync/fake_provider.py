"""A fake Graph-style provider: a real aiohttp server on 127.0.0.1 with scripted answers.

- Items: `put_item(drive, item, **fields)`; `script(drive, item, 404, 404, 200)` queues
  statuses answered before falling back to the item (or `forever=` a status).
- Delta: `set_delta(drive, token, pages, next_token)` serves `pages` from `token` ("" is
  a full enumeration) chained by @odata.nextLink, the last one with an @odata.deltaLink
  for `next_token`; `expire(drive, token)` answers 410 for that cursor.
- `hold(drive, item)` parks GETs of that item until the test releases them.
- `set_page(drive, token, body)` serves any body for a cursor (e.g. a foreign nextLink).
- Every request lands in `calls` with a monotonic timestamp and its bearer token.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


def _bearer(request: web.Request) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" else ""


@dataclass(frozen=True)
class Call:
    """One request the fake received."""

    kind: str  # "item" or "delta"
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
    """Start with `await fake.start()`; `base_url` then points at it."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        self.scripts: dict[tuple[str, str], deque[Scripted]] = defaultdict(deque)
        self.forever: dict[tuple[str, str], Scripted] = {}
        self.delta: dict[tuple[str, str], dict[str, Any] | Scripted] = {}
        self.calls: list[Call] = []
        self.held: dict[tuple[str, str], Held] = {}
        self.base_url = ""
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

    async def start(self) -> None:
        """Serve on 127.0.0.1, any free port."""
        app = web.Application()
        app.router.add_get("/drives/{drive}/items/{item}", self._item)
        app.router.add_get("/drives/{drive}/root/delta", self._delta)
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
