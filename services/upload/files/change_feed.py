"""ListChanges: a snapshot of the caller's view, then every change to it (change_log.py).

The cursor is a signed page token (services/common/page_tokens.py) bound to the tenant and
the user, holding a phase and a log position:

- `["s", P, after_id]`: in a snapshot begun when the tenant's log stood at P, items with
  ids above `after_id` still to list. Pages go through the tenant's items by id and list
  those in the view (change_view.py) as they are when the page is read. An item changed
  while the snapshot is paged has a log row after P, so the changes replayed from P bring
  it to its newest state; an item not changed since P is listed once, as it is. Hence no
  item is missed and, within the snapshot, none is listed twice.
- `["l", seq, ""]`: the log rows of this user after `seq`, in order. Each row becomes one
  Change saying how the item stands *now*: in the view (its File, with the caller's role)
  or not (a tombstone). Applying them in order to the state at the cursor gives the view
  at `next_cursor`; a row never appears in two pages.

A position below the tenant's `purged_through` is CURSOR_EXPIRED (checked after the rows
are read, so a purge racing the read cannot leave a silent gap). Memory is bounded by the
page size: one page of rows and the items above them.
"""

from __future__ import annotations

import asyncio
import time

from serentak.upload.v1 import upload_pb2
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.auth import Identity
from services.common.db import read_only
from services.common.errors import InvalidArgument
from services.common.page_tokens import InvalidPageToken, PageTokens
from services.upload import convert
from services.upload.errors import CursorExpired
from services.upload.files import change_log
from services.upload.files.change_view import ViewJudge
from services.upload.files.change_waits import ChangeSignals
from services.upload.files.tree import ensure_root
from services.upload.models import ChangeRow, FileRow

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
# The answer must reach the caller before its deadline: a wait ends this much earlier.
DEADLINE_MARGIN_SECONDS = 0.2

_K = upload_pb2
_SEEN_KIND = {
    "folder.created": _K.CHANGE_KIND_CREATED,
    "file.content.updated": _K.CHANGE_KIND_CONTENT_UPDATED,
    "file.renamed": _K.CHANGE_KIND_RENAMED,
    "file.moved": _K.CHANGE_KIND_MOVED,
    "file.deleted": _K.CHANGE_KIND_RESTORED,  # deleted, yet in the view again: restored since
    "file.restored": _K.CHANGE_KIND_RESTORED,
    "file.shared": _K.CHANGE_KIND_SHARING_CHANGED,
    "file.unshared": _K.CHANGE_KIND_SHARING_CHANGED,
}


# Events after which an item out of the view was deleted (hidden: tombstoned upstream).
_GONE = ("file.deleted", "file.hidden")


def _kind(row: ChangeRow, item: FileRow | None, visible: bool) -> upload_pb2.ChangeKind:
    """How the caller should read this change, given whether the item is in its view now."""
    if visible:
        if row.via_folder or (row.named and row.event_type == "file.shared"):
            return _K.CHANGE_KIND_ENTERED_VIEW
        if row.event_type == "file.content.updated" and row.version == 1:
            return _K.CHANGE_KIND_CREATED
        return _SEEN_KIND.get(row.event_type, _K.CHANGE_KIND_UNSPECIFIED)
    if item is None or item.deleted_at is not None or row.event_type in _GONE:
        return _K.CHANGE_KIND_DELETED
    return _K.CHANGE_KIND_LEFT_VIEW


class ChangeFeed:
    """The ListChanges use case."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        tokens: PageTokens,
        signals: ChangeSignals,
        *,
        max_wait_ms: int = 60_000,
    ) -> None:
        self._sessions = sessions
        self._tokens = tokens
        self._signals = signals
        self._max_wait_ms = max_wait_ms

    def _decode(self, identity: Identity, cursor: str) -> tuple[str, int, str] | None:
        purpose = f"changes:{identity.tenant_id}:{identity.user_id}"
        try:
            position = self._tokens.decode(cursor, purpose, 3, field="cursor")
        except InvalidPageToken:
            raise InvalidArgument(
                "cursor", "is not a cursor ListChanges gave this caller", reason="CURSOR_INVALID"
            ) from None
        if position is None:
            return None
        phase, seq, after = position
        if phase not in ("s", "l") or not isinstance(seq, int) or not isinstance(after, str):
            raise InvalidArgument("cursor", "is malformed", reason="CURSOR_INVALID")
        return str(phase), seq, after

    def _encode(self, identity: Identity, phase: str, seq: int, after: str = "") -> str:
        purpose = f"changes:{identity.tenant_id}:{identity.user_id}"
        return self._tokens.encode(purpose, [phase, seq, after])

    async def list_changes(
        self,
        identity: Identity,
        request: upload_pb2.ListChangesRequest,
        time_remaining: float | None = None,
    ) -> upload_pb2.ListChangesResponse:
        """One page of changes after `request.cursor` (a snapshot from an empty one)."""
        if request.page_size < 0 or request.page_size > MAX_PAGE_SIZE:
            raise InvalidArgument("page_size", f"must be 0..{MAX_PAGE_SIZE}")
        if request.wait_ms < 0:
            raise InvalidArgument("wait_ms", "must not be negative")
        size = request.page_size or DEFAULT_PAGE_SIZE
        position = self._decode(identity, request.cursor)
        if position is None:
            # The root exists before the snapshot starts, so it is always listed.
            await ensure_root(self._sessions, identity)
            async with self._sessions() as session:
                await read_only(session)
                start, _ = await change_log.head(session, identity.tenant_id)
            page = await self._snapshot_page(identity, start, "", size)
            page.reset = True
            return page
        phase, seq, after = position
        if phase == "s":
            return await self._snapshot_page(identity, seq, after, size)
        wait = min(request.wait_ms, self._max_wait_ms) / 1000
        if time_remaining is not None:
            wait = min(wait, time_remaining - DEADLINE_MARGIN_SECONDS)
        return await self._log_page_waiting(identity, seq, size, wait)

    async def _snapshot_page(
        self, identity: Identity, start: int, after: str, size: int
    ) -> upload_pb2.ListChangesResponse:
        response = upload_pb2.ListChangesResponse()
        async with self._sessions() as session:
            await read_only(session)
            rows = list(
                (
                    await session.execute(
                        select(FileRow)
                        .where(FileRow.tenant_id == identity.tenant_id, FileRow.id > after)
                        .order_by(FileRow.id)
                        .limit(size + 1)
                    )
                ).scalars()
            )
            page = rows[:size]
            judge = ViewJudge(session, identity)
            judge.remember(page)
            await judge.load([r.id for r in page])
            for row in page:
                role = await judge.role(row.id)
                if role is not None:
                    response.changes.add(
                        kind=_K.CHANGE_KIND_LISTED,
                        file_id=row.id,
                        file=convert.file_message(row, role),
                    )
            await self._check_kept(session, identity, start)
            if len(rows) > size:
                response.next_cursor = self._encode(identity, "s", start, page[-1].id)
                response.has_more = True
            else:
                response.next_cursor = self._encode(identity, "l", start)
                response.has_more = await self._rows_after(session, identity, start, 1) != []
        return response

    async def _check_kept(self, session: AsyncSession, identity: Identity, seq: int) -> None:
        _, purged = await change_log.head(session, identity.tenant_id)
        if seq < purged:
            raise CursorExpired(
                "the cursor is older than the change log's retention: start again from an"
                " empty cursor",
                tenant_id=identity.tenant_id,
            )

    async def _rows_after(
        self, session: AsyncSession, identity: Identity, seq: int, limit: int
    ) -> list[ChangeRow]:
        query = (
            select(ChangeRow)
            .where(
                ChangeRow.tenant_id == identity.tenant_id,
                ChangeRow.user_id == identity.user_id,
                ChangeRow.seq > seq,
            )
            .order_by(ChangeRow.seq)
            .limit(limit)
        )
        return list((await session.execute(query)).scalars())

    async def _log_page(
        self, identity: Identity, seq: int, size: int
    ) -> upload_pb2.ListChangesResponse:
        response = upload_pb2.ListChangesResponse()
        async with self._sessions() as session:
            await read_only(session)
            rows = await self._rows_after(session, identity, seq, size + 1)
            # After the read: a purge that ran before it moved purged_through first.
            await self._check_kept(session, identity, seq)
            page = rows[:size]
            judge = ViewJudge(session, identity)
            await judge.load([r.file_id for r in page])
            for row in page:
                item = await judge.row(row.file_id)
                role = await judge.role(row.file_id)
                change = response.changes.add(
                    kind=_kind(row, item, role is not None), file_id=row.file_id
                )
                if item is not None and role is not None:
                    change.file.CopyFrom(convert.file_message(item, role))
                else:
                    change.removed = True
        last = page[-1].seq if page else seq
        response.next_cursor = self._encode(identity, "l", last)
        response.has_more = len(rows) > size
        return response

    async def _log_page_waiting(
        self, identity: Identity, seq: int, size: int, wait: float
    ) -> upload_pb2.ListChangesResponse:
        """`_log_page`, waiting up to `wait` seconds for a change when there is none."""
        if wait <= 0:
            return await self._log_page(identity, seq, size)
        end = time.monotonic() + wait
        with self._signals.waiting(identity.tenant_id) as woken:
            while True:
                # Registered before the read: a commit after it wakes the wait below.
                woken.clear()
                page = await self._log_page(identity, seq, size)
                remaining = end - time.monotonic()
                if page.changes or remaining <= 0:
                    return page
                try:
                    async with asyncio.timeout(min(remaining, self._signals.recheck_seconds)):
                        await woken.wait()
                except TimeoutError:
                    pass  # a change committed by another replica is found by the re-read
