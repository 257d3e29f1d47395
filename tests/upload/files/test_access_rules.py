"""The access rules (README "Access rules"): moves never widen access, racing moves never
make a cycle, walks up the tree are bounded, the listing computes the caller's role once
and its cache never shows one caller's role to another."""

from __future__ import annotations

import asyncio
import sqlite3

import grpc
import psycopg
from serentak.upload.v1 import upload_pb2
from sqlalchemy import event, text
from sqlalchemy.engine import Engine, make_url
from upload.tree_helpers import folder, listing, move, parent_of, role, share, upload
from upload.upload_helpers import download, expect_error

from services.common.db import create_engine

OWNER, EDITOR, VIEWER = upload_pb2.ROLE_OWNER, upload_pb2.ROLE_EDITOR, upload_pb2.ROLE_VIEWER


async def test_an_editor_cannot_move_the_owners_file_into_his_shared_folder(cluster) -> None:
    alice, bob, carol = cluster["alice"], cluster["bob"], cluster["carol"]
    project = await folder(alice, "project")
    await share(alice, project, "bob", EDITOR)
    secret = await upload(alice, b"alice's plan", "plan.txt", project)
    bobs = await folder(bob, "bob-shared")
    await share(bob, bobs, "carol", EDITOR)
    # Bob may edit the file, but not take it out of alice's tree into his own.
    await expect_error(
        move(bob, secret, bobs), grpc.StatusCode.PERMISSION_DENIED, "MOVE_NOT_ALLOWED"
    )
    assert await parent_of(alice, secret) == project
    assert await role(carol, secret) is None
    await expect_error(download(carol, secret), grpc.StatusCode.NOT_FOUND, "FILE_NOT_FOUND")
    # Within alice's tree an editor of both folders may reorganise.
    archive = await folder(alice, "archive", project)
    moved = await move(bob, secret, archive)
    assert moved.parent_id == archive and moved.role == EDITOR


async def test_a_share_does_not_reach_into_another_owners_item(cluster) -> None:
    """The owner herself moves her file into bob's shared folder: bob and carol get nothing."""
    alice, bob, carol = cluster["alice"], cluster["bob"], cluster["carol"]
    bobs = await folder(bob, "bob-shared")
    await share(bob, bobs, "carol", EDITOR)
    await share(bob, bobs, "alice", EDITOR)
    secret = await upload(alice, b"alice only", "mine.txt")
    moved = await move(alice, secret, bobs)
    assert moved.parent_id == bobs and moved.role == OWNER
    for outsider in (bob, carol):
        assert await role(outsider, secret) is None
        assert secret not in await listing(outsider, bobs)
        await expect_error(
            outsider.files.DeleteFile(
                upload_pb2.DeleteFileRequest(file_id=secret), metadata=outsider.metadata
            ),
            grpc.StatusCode.NOT_FOUND,
            "FILE_NOT_FOUND",
        )
    assert (await listing(alice, bobs))[secret] == OWNER
    # A share alice makes on the file itself does reach bob.
    await share(alice, secret, "bob", VIEWER)
    assert await role(bob, secret) == VIEWER
    assert (await listing(bob, bobs))[secret] == VIEWER
    assert await role(carol, secret) is None
    # A share names a user of the sharer's tenant: mallory (tenant evil) gains nothing.
    await share(alice, secret, "mallory", EDITOR)
    assert await role(cluster["mallory"], secret) is None


async def test_the_listing_cache_never_shows_another_callers_role(cluster) -> None:
    alice, bob, carol = cluster["alice"], cluster["bob"], cluster["carol"]
    for first, second in (("viewer", "owner"), ("owner", "viewer")):
        shared = await folder(alice, f"shared-{first}")
        await share(alice, shared, "bob", VIEWER)
        child = await folder(alice, "child", shared)
        callers = {"viewer": bob, "owner": alice}
        expected = {"viewer": VIEWER, "owner": OWNER}
        for who in (first, second, first):
            assert await listing(callers[who], shared) == {child: expected[who]}, who
        await expect_error(
            carol.files.ListFolder(
                upload_pb2.ListFolderRequest(folder_id=shared), metadata=carol.metadata
            ),
            grpc.StatusCode.NOT_FOUND,
            "FILE_NOT_FOUND",
        )


async def test_racing_moves_never_make_a_cycle(cluster) -> None:
    alice = cluster["alice"]
    for n in range(15):
        a = await folder(alice, f"a{n}")
        b = await folder(alice, f"b{n}")
        results = await asyncio.gather(move(alice, a, b), move(alice, b, a), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        # Exactly one wins; the other sees the winner's move and is refused.
        assert len(failures) == 1, results
        assert isinstance(failures[0], grpc.aio.AioRpcError), failures[0]
        assert failures[0].code() == grpc.StatusCode.INVALID_ARGUMENT, failures[0]
        for start in (a, b):
            seen, current = set(), start
            while current:
                assert current not in seen, f"cycle through {current}"
                seen.add(current)
                current = await parent_of(alice, current)


async def test_a_corrupt_cycle_cannot_hang_the_service(cluster) -> None:
    """Walks up the tree are bounded: a cycle written behind the service's back answers."""
    alice, bob = cluster["alice"], cluster["bob"]
    a = await folder(alice, "a")
    b = await folder(alice, "b", a)
    await share(alice, b, "bob", EDITOR)
    loose = await folder(alice, "loose")
    engine = create_engine(cluster.settings.upload_database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text("UPDATE files SET parent_id = :b WHERE id = :a"), {"a": a, "b": b}
            )
    finally:
        await engine.dispose()

    async def calls() -> None:
        assert await role(bob, b) == EDITOR
        assert await listing(bob, b) == {a: EDITOR}
        await expect_error(
            move(alice, loose, a), grpc.StatusCode.FAILED_PRECONDITION, "TREE_TOO_DEEP"
        )
        await expect_error(move(bob, loose, b), grpc.StatusCode.NOT_FOUND, "FILE_NOT_FOUND")
        await expect_error(
            alice.files.CreateFolder(
                upload_pb2.CreateFolderRequest(name="x", parent_id=b), metadata=alice.metadata
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            "TREE_TOO_DEEP",
        )
        # Meanwhile everyone else is served.
        await folder(cluster["carol"], "still-served")

    await asyncio.wait_for(calls(), timeout=30)


async def test_the_tree_has_a_depth_limit(cluster) -> None:
    alice = cluster["alice"]
    top = await folder(alice, "d1")
    parent, chain = top, [top]
    # The root holds d1; folders nest at most 64 deep counting the root.
    for depth in range(2, 64):
        parent = await folder(alice, f"d{depth}", parent)
        chain.append(parent)
    await expect_error(
        alice.files.CreateFolder(
            upload_pb2.CreateFolderRequest(name="too-deep", parent_id=parent),
            metadata=alice.metadata,
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "TREE_TOO_DEEP",
    )
    # A file may still go into the deepest folder; a folder with a subfolder may not move
    # where its subfolder would be too deep.
    await upload(alice, b"deep", "deep.txt", parent)
    sub = await folder(alice, "sub")
    await folder(alice, "subsub", sub)
    await expect_error(
        move(alice, sub, chain[-2]), grpc.StatusCode.FAILED_PRECONDITION, "TREE_TOO_DEEP"
    )
    assert (await move(alice, sub, chain[-3])).parent_id == chain[-3]


async def test_a_viewers_deep_listing_takes_a_bounded_number_of_queries(cluster) -> None:
    alice, bob = cluster["alice"], cluster["bob"]
    top = await folder(alice, "deep")
    await share(alice, top, "bob", VIEWER)
    parent = top
    for depth in range(40):
        parent = await folder(alice, f"level{depth}", parent)
    for n in range(30):
        await folder(alice, f"entry{n:02}", parent)
    statements: list[str] = []

    def count(_conn, _cursor, statement, *_args) -> None:
        statements.append(statement)

    event.listen(Engine, "before_cursor_execute", count)
    try:
        seen = await listing(bob, parent)
        # Other statements (the job runtime's polls) may interleave; count the tree's.
        tree_queries = [s for s in statements if "files" in s or "shares" in s]
    finally:
        event.remove(Engine, "before_cursor_execute", count)
    assert len(seen) == 30 and set(seen.values()) == {VIEWER}
    # Folder, its chain, the page, the caller's shares on the page (+ tombstones, root).
    assert len(tree_queries) <= 8, tree_queries


async def test_reads_do_not_wait_for_the_write_lock(cluster) -> None:
    """GetFile and ListFolder read a snapshot: a writer holding the database's write lock
    (SQLite: BEGIN IMMEDIATE; PostgreSQL: an EXCLUSIVE lock on files) does not stall them.
    (Before, a read waited for SQLite's lock up to its 30 s busy timeout: past the deadline.)"""
    alice, bob = cluster["alice"], cluster["bob"]
    top = await folder(alice, "top")
    await share(alice, top, "bob", VIEWER)
    child = await folder(alice, "child", top)
    url = make_url(cluster.settings.upload_database_url)
    # Taken off the event loop: the in-process service's own writers must be able to
    # finish while the holder waits its turn.
    if url.get_backend_name() == "sqlite":
        holder = sqlite3.connect(
            url.database, isolation_level=None, timeout=30, check_same_thread=False
        )
        await asyncio.to_thread(holder.execute, "BEGIN IMMEDIATE")
    else:
        holder = psycopg.connect(url.set(drivername="postgresql").render_as_string(False))
        await asyncio.to_thread(holder.execute, "LOCK TABLE files IN EXCLUSIVE MODE")
    try:
        page = await bob.files.ListFolder(
            upload_pb2.ListFolderRequest(folder_id=top), metadata=bob.metadata, timeout=25
        )
        assert [(f.file_id, f.role) for f in page.files] == [(child, VIEWER)]
        found = await bob.files.GetFile(
            upload_pb2.GetFileRequest(file_id=child), metadata=bob.metadata, timeout=25
        )
        assert found.role == VIEWER
    finally:
        holder.rollback()
        holder.close()
