"""The SDK's `changes()`: a snapshot of the caller's view, then the changes since, and
`follow=True` waiting on the server for the next ones. Both DBs."""

from __future__ import annotations

import asyncio

from serentak.sdk import ChangeKind


async def test_changes_snapshot_then_follow(stack) -> None:
    async with stack.client("dev-alice") as alice, stack.client("dev-bob") as bob:
        docs = await alice.create_folder("docs")
        await alice.share(docs.file_id, "bob", "viewer")
        pages = [page async for page in bob.changes(page_size=1)]
        assert pages[0].reset and not pages[-1].has_more
        listed = {c.file_id: c for p in pages for c in p.changes}
        assert listed[docs.file_id].kind == ChangeKind.LISTED
        assert str(listed[docs.file_id].kind) == "listed"
        cursor = pages[-1].next_cursor
        # Nothing new: the iteration ends at once with one page and the same position.
        quiet = [page async for page in bob.changes(cursor)]
        assert [len(p.changes) for p in quiet] == [0]

        follow = bob.changes(cursor, follow=True)
        caught_up = await anext(follow)
        assert not caught_up.changes and not caught_up.has_more
        waiting = asyncio.ensure_future(anext(follow))
        await alice.rename(docs.file_id, "papers")
        got = await asyncio.wait_for(waiting, 30)
        assert [(str(c.kind), c.file.name) for c in got.changes] == [("renamed", "papers")]
        await alice.unshare(docs.file_id, "bob")
        gone = await asyncio.wait_for(anext(follow), 30)
        assert [(c.kind, c.removed) for c in gone.changes] == [(ChangeKind.LEFT_VIEW, True)]
        await follow.aclose()
