"""What a caller can see, item by item: the view ListChanges reports changes of.

An item is in the caller's view when it is live (not deleted, not hidden by a feature
such as sync's tombstones) and
- it is the caller's root folder, or
- it is shared with the caller directly (what ListSharedWithMe lists), or
- its folder is in the view and the caller has a role on it (what ListFolder lists).

So the view is exactly what a client browsing ListFolder from its root and from each item
shared with it reaches. The roles are the access rules' (permissions.py): a share reaches
down only through items of the same owner. Answers are remembered for one `ViewJudge`
(one page of ListChanges), so a page costs a query per distinct folder above its items.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from services.common.auth import Identity
from services.upload.files.permissions import MAX_DEPTH, best
from services.upload.files.visibility import hidden_file_ids
from services.upload.models import OWNER, FileRow, ShareRow


class ViewJudge:
    """Answers "is this item in the caller's view, and with which role" within one read."""

    def __init__(self, session: AsyncSession, identity: Identity) -> None:
        self._session = session
        self._identity = identity
        self._rows: dict[str, FileRow | None] = {}
        self._shares: dict[str, str] | None = None
        self._hidden: dict[str, bool] = {}
        # file id -> the best share reaching it through items of its owner (None: none).
        self._inherited: dict[str, str | None] = {}
        # file id -> the caller's role if the item is in the view, else None.
        self._view: dict[str, str | None] = {}

    async def load(self, file_ids: list[str]) -> None:
        """Fetch these items (one query) and whether they are hidden (one per rule)."""
        missing = [i for i in dict.fromkeys(file_ids) if i not in self._rows]
        if missing:
            rows = await self._session.execute(
                select(FileRow).where(
                    FileRow.id.in_(missing), FileRow.tenant_id == self._identity.tenant_id
                )
            )
            found = {row.id: row for row in rows.scalars()}
            for file_id in missing:
                self._rows[file_id] = found.get(file_id)
        unknown = [i for i in dict.fromkeys(file_ids) if i not in self._hidden]
        if unknown:
            hidden = await hidden_file_ids(self._session, self._identity.tenant_id, unknown)
            for file_id in unknown:
                self._hidden[file_id] = file_id in hidden

    def remember(self, rows: list[FileRow]) -> None:
        """Items read already (a snapshot page), so they are not fetched again."""
        for row in rows:
            self._rows.setdefault(row.id, row)

    async def row(self, file_id: str) -> FileRow | None:
        """The item (None: gone or in another tenant)."""
        if file_id not in self._rows or file_id not in self._hidden:
            await self.load([file_id])
        return self._rows[file_id]

    async def _direct(self) -> dict[str, str]:
        if self._shares is None:
            rows = await self._session.execute(
                select(ShareRow.file_id, ShareRow.role)
                .join(FileRow, FileRow.id == ShareRow.file_id)
                .where(
                    ShareRow.user_id == self._identity.user_id,
                    FileRow.tenant_id == self._identity.tenant_id,
                )
            )
            self._shares = {file_id: role for file_id, role in rows.all()}
        return self._shares

    async def _share_down(self, row: FileRow, depth: int) -> str | None:
        if row.id in self._inherited:
            return self._inherited[row.id]
        role = (await self._direct()).get(row.id)
        if row.parent_id is not None and depth < MAX_DEPTH:
            parent = await self.row(row.parent_id)
            if parent is not None and parent.owner_user_id == row.owner_user_id:
                role = best(role, await self._share_down(parent, depth + 1))
        self._inherited[row.id] = role
        return role

    async def role(self, file_id: str, depth: int = 0) -> str | None:
        """The caller's role on the item if it is in their view now, else None."""
        if file_id in self._view:
            return self._view[file_id]
        row = await self.row(file_id)
        role: str | None = None
        if row is not None and row.deleted_at is None and not self._hidden.get(file_id):
            own = OWNER if row.owner_user_id == self._identity.user_id else None
            entry = (own is not None and row.parent_id is None) or (file_id in await self._direct())
            if entry or (
                row.parent_id is not None
                and depth < MAX_DEPTH
                and await self.role(row.parent_id, depth + 1) is not None
            ):
                role = own or await self._share_down(row, depth)
        self._view[file_id] = role
        return role
