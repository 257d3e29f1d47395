"""ListChanges under random concurrent changes by several users (SQLite and PostgreSQL).

Three users create folders, upload, rename, move, delete, restore, share and unshare at
once, while each user's sync client pages through its feed (starting with the snapshot)
and keeps checkpoints: its cursor and its copy of the view at that cursor. Afterwards, for
every user and every checkpoint, applying the changes after the cursor to the copy gives
exactly what the listings show now, and the changes replayed from a cursor are the very
ones the client received after it then (none twice, none missing).
"""

from __future__ import annotations

import asyncio
import base64
import json
import random

import grpc
import pytest
from serentak.upload.v1 import upload_pb2
from upload.change_helpers import FeedCopy, view
from upload.tree_helpers import folder, upload

USERS = ("alice", "bob", "carol")
# Weighted: folders and moves reshape the tree, shares change who sees it.
OPS = ("folder", "folder", "upload", "rename", "move", "move", "delete", "restore", "share")
OPS += ("share", "unshare")
ROLES = (upload_pb2.ROLE_VIEWER, upload_pb2.ROLE_EDITOR)
# Refusals a random operation may meet (the access rules, names, the trash): not failures.
EXPECTED = {
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.ABORTED,
}


class Workload:
    """Random operations of one user on the items anyone created."""

    def __init__(self, cluster, rng: random.Random, items: list[str], roots: dict[str, str]):
        self.cluster = cluster
        self.rng = rng
        self.items = items
        self.roots = roots

    def target(self) -> str:
        return self.rng.choice(self.items)

    def place(self, user: str) -> str:
        return self.rng.choice([*self.items, self.roots[user], self.roots[user]])

    async def step(self, user: str, n: int) -> None:
        c = self.cluster[user]
        files = c.files
        op = self.rng.choice(OPS)
        try:
            if op == "folder":
                self.items.append(await folder(c, f"{user}-{n}", self.place(user)))
            elif op == "upload":
                self.items.append(await upload(c, f"{user}{n}".encode(), f"f{n}", self.place(user)))
            elif op == "rename":
                await files.RenameFile(
                    upload_pb2.RenameFileRequest(file_id=self.target(), new_name=f"r{user}{n}"),
                    metadata=c.metadata,
                )
            elif op == "move":
                await files.MoveFile(
                    upload_pb2.MoveFileRequest(
                        file_id=self.target(), new_parent_id=self.place(user)
                    ),
                    metadata=c.metadata,
                )
            elif op == "delete":
                await files.DeleteFile(
                    upload_pb2.DeleteFileRequest(file_id=self.target()), metadata=c.metadata
                )
            elif op == "restore":
                await files.RestoreFile(
                    upload_pb2.RestoreFileRequest(file_id=self.target()), metadata=c.metadata
                )
            elif op == "share":
                await files.ShareFile(
                    upload_pb2.ShareFileRequest(
                        file_id=self.rng.choice([*self.items, self.roots[user]]),
                        user_id=self.rng.choice([u for u in USERS if u != user]),
                        role=self.rng.choice(ROLES),
                    ),
                    metadata=c.metadata,
                )
            else:
                await files.UnshareFile(
                    upload_pb2.UnshareFileRequest(
                        file_id=self.target(), user_id=self.rng.choice(USERS)
                    ),
                    metadata=c.metadata,
                )
        except grpc.aio.AioRpcError as exc:
            assert exc.code() in EXPECTED, (op, exc.code(), exc.details())


def _phase(cursor: str) -> str:
    """The cursor's phase ("s": snapshot, "l": log), read from its signed JSON body."""
    body = cursor.split(".")[0]
    return str(json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))[1])


async def _follow(feed: FeedCopy, done: asyncio.Event, checkpoints: list) -> None:
    """Page through the feed while the workload runs, keeping a checkpoint per page."""
    while not done.is_set():
        await feed.page(page_size=3)
        checkpoints.append((feed.cursor, dict(feed.state), len(feed.received)))
    await feed.catch_up()


@pytest.mark.parametrize("seed", [1, 2])
async def test_changes_after_any_cursor_rebuild_the_view(cluster, seed: int) -> None:
    rng = random.Random(seed)
    roots: dict[str, str] = {}
    items: list[str] = []
    for user in USERS:
        made = await folder(cluster[user], f"{user}-start")
        items.append(made)
        got = await cluster[user].files.GetFile(
            upload_pb2.GetFileRequest(file_id=made), metadata=cluster[user].metadata
        )
        roots[user] = got.parent_id
    work = Workload(cluster, rng, items, roots)
    feeds = {user: FeedCopy(cluster[user]) for user in USERS}
    checkpoints: dict[str, list] = {user: [] for user in USERS}
    done = asyncio.Event()

    async def act(user: str) -> None:
        for n in range(25):
            await work.step(user, n)

    readers = [asyncio.create_task(_follow(feeds[u], done, checkpoints[u])) for u in USERS]
    try:
        await asyncio.gather(*(act(u) for u in USERS))
    finally:
        done.set()
        await asyncio.gather(*readers)

    for user in USERS:
        now = await view(cluster[user])
        feed = feeds[user]
        assert feed.items() == now, user
        assert checkpoints[user], user
        for cursor, state, seen in checkpoints[user]:
            replay = FeedCopy(cluster[user], cursor, dict(state))
            await replay.catch_up(page_size=7)
            assert replay.items() == now, (user, seen)
            after = feed.received[seen:]
            # Past the snapshot, a cursor names a log position: its rows, each exactly once.
            # (The rest of a snapshot is read as it stands when read, so it may differ.)
            if _phase(cursor) == "l":
                assert [f for _, f, _ in replay.received] == [f for _, f, _ in after], user
