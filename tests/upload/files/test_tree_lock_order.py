"""One lock order for every change of a tenant's tree: the tree lock first, then rows
(services/upload/files/tree.py `lock_tree`). A transaction that wrote before asking for the
lock is refused on PostgreSQL before it can deadlock, and changes that each write the same
folder's row (shares, new files, new versions, renames) race without a deadlock."""

from __future__ import annotations

import asyncio
import os

import pytest
from serentak.upload.v1 import upload_pb2
from sqlalchemy import event, select, text
from sqlalchemy.engine import Engine
from upload.tree_helpers import folder
from upload.upload_helpers import chunk_request, create_request, wait_status

from services.common.group_commit import GroupCommits
from services.upload.files.tree import TreeLockOrder, lock_tree
from services.upload.files.versions import touch_folder
from services.upload.models import FileRow

ROUNDS = 3
PER_ROUND = 6


def _postgres_only(cluster) -> None:
    if cluster.settings.database_url.startswith("sqlite"):
        pytest.skip("SQLite begins every writer IMMEDIATE: there is no tree lock to order")


async def test_the_tree_lock_after_a_written_row_is_refused(cluster, sessions) -> None:
    _postgres_only(cluster)
    root = await folder(cluster["alice"], "any")
    async with sessions() as session:
        parent = await session.scalar(select(FileRow.parent_id).where(FileRow.id == root))
    with pytest.raises(TreeLockOrder):
        async with sessions.begin() as session:
            await touch_folder(session, parent)
            await lock_tree(session, "acme")


async def test_the_tree_lock_first_then_rows_then_again_is_one_lock(cluster, sessions) -> None:
    _postgres_only(cluster)
    made = await folder(cluster["alice"], "any")
    async with sessions.begin() as session:
        # Several tenants' locks before any row (a batch across tenants), in sorted order.
        await lock_tree(session, "acme")
        await lock_tree(session, "evil")
        await touch_folder(session, made)
        # Held already: a no-op, not a refusal, though the transaction has written.
        await lock_tree(session, "acme")
        changed = await session.scalar(select(FileRow.children_version).where(FileRow.id == made))
    assert changed == 1


async def _tree_lock_held(session, tenant: str) -> bool:
    """Whether this session's backend holds `tenant`'s tree lock (pg_locks)."""
    return bool(
        await session.scalar(
            text(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'"
                " AND pid = pg_backend_pid() AND granted AND objsubid = 2"
                " AND objid = CAST(hashtext(:tenant) AS oid))"
            ),
            {"tenant": tenant},
        )
    )


async def test_asking_again_for_a_held_tree_lock_costs_no_statement(cluster, sessions) -> None:
    _postgres_only(cluster)
    async with sessions.begin() as session:
        await lock_tree(session, "acme")
        statements: list[str] = []

        def count(_conn, _cursor, statement, *_args) -> None:
            statements.append(statement)

        event.listen(Engine, "before_cursor_execute", count)
        try:
            await lock_tree(session, "acme")
            async with session.begin_nested():
                await lock_tree(session, "acme")  # taken around this savepoint: still held
        finally:
            event.remove(Engine, "before_cursor_execute", count)
        assert not [s for s in statements if "pg_advisory_xact_lock" in s]


async def test_a_rolled_back_savepoint_gives_its_tree_lock_back_and_is_asked_again(
    cluster, sessions
) -> None:
    """The memo of a held lock ends with the savepoint that took it: rolled back, the lock
    is gone (PostgreSQL releases it), and the next ask takes it again."""
    _postgres_only(cluster)
    async with sessions.begin() as session:
        savepoint = await session.begin_nested()
        await lock_tree(session, "acme")
        assert await _tree_lock_held(session, "acme")
        await savepoint.rollback()
        assert not await _tree_lock_held(session, "acme")
        await lock_tree(session, "acme")
        assert await _tree_lock_held(session, "acme")


class _Refused(Exception):
    pass


async def test_a_group_commit_takes_each_units_tree_lock_after_the_units_before(
    cluster, sessions
) -> None:
    """A group's units run sorted by tenant in one transaction (each in a savepoint once a
    unit was refused): a unit takes its tenant's lock after earlier units wrote (another
    tenant's rows, or its own tenant's rolled back with a refused unit), and that is the
    group's order, not a wrong one."""
    _postgres_only(cluster)
    made = await folder(cluster["alice"], "any")
    sizes: list[int] = []
    groups = GroupCommits(sessions, on_group=sizes.append)

    def unit(tenant: str, refuse: bool = False):
        async def work(session) -> str:
            await lock_tree(session, tenant)
            await touch_folder(session, made)
            if refuse:
                raise _Refused(tenant)
            return tenant

        return work

    try:
        outcomes = await asyncio.gather(
            groups.run(unit("acme", refuse=True), ("acme", "1")),
            groups.run(unit("acme"), ("acme", "2")),
            groups.run(unit("evil"), ("evil",)),
            return_exceptions=True,
        )
    finally:
        await groups.close()
    assert sizes == [2]  # one group: the two units not refused committed together
    assert isinstance(outcomes[0], _Refused) and outcomes[1:] == ["acme", "evil"]
    async with sessions() as session:
        bumped = await session.scalar(select(FileRow.children_version).where(FileRow.id == made))
    assert bumped == 2  # the two units that were not refused


async def test_shares_uploads_and_renames_of_one_folder_race_without_a_deadlock(
    cluster,
) -> None:
    alice = cluster["alice"]
    place = await folder(alice, "busy")
    kept = await alice.uploads.UploadFile(
        upload_pb2.UploadFileRequest(
            new_file=upload_pb2.NewFileTarget(folder_id=place, name="kept.bin"), data=b"k"
        ),
        metadata=alice.metadata,
    )
    file_id = kept.file.file_id

    async def small(n: int) -> None:
        await alice.uploads.UploadFile(
            upload_pb2.UploadFileRequest(
                new_file=upload_pb2.NewFileTarget(folder_id=place, name=f"s{n}.bin"),
                data=os.urandom(100 + n),
            ),
            metadata=alice.metadata,
        )

    async def version(n: int) -> None:
        data = os.urandom(300 + n)
        request = create_request(data, 1024)
        request.file_id = file_id  # the next version (the merge job's commit)
        made = await alice.uploads.CreateUpload(request, metadata=alice.metadata)
        await alice.uploads.PutChunk(
            chunk_request(made.upload_id, 0, data), metadata=alice.metadata
        )
        await wait_status(alice, made.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)

    async def share(n: int) -> None:
        user = ("bob", "carol")[n % 2]
        await alice.files.ShareFile(
            upload_pb2.ShareFileRequest(file_id=file_id, user_id=user, role=upload_pb2.ROLE_VIEWER),
            metadata=alice.metadata,
        )
        await alice.files.UnshareFile(
            upload_pb2.UnshareFileRequest(file_id=file_id, user_id=user),
            metadata=alice.metadata,
        )

    async def rename(n: int) -> None:
        made = await folder(alice, f"d{n}", place)
        await alice.files.RenameFile(
            upload_pb2.RenameFileRequest(file_id=made, new_name=f"renamed-{n}"),
            metadata=alice.metadata,
        )

    for r in range(ROUNDS):
        ids = range(r * PER_ROUND, (r + 1) * PER_ROUND)
        # Each call must succeed: a deadlock would answer one of them INTERNAL.
        await asyncio.gather(
            *(small(n) for n in ids),
            *(version(n) for n in ids[:2]),
            *(share(n) for n in ids[:2]),
            *(rename(n) for n in ids[:2]),
        )
    listed = await alice.files.ListFolder(
        upload_pb2.ListFolderRequest(folder_id=place, page_size=1000), metadata=alice.metadata
    )
    names = {f.name for f in listed.files}
    assert {f"s{n}.bin" for n in range(ROUNDS * PER_ROUND)} <= names
    renamed = {f"renamed-{r * PER_ROUND + k}" for r in range(ROUNDS) for k in range(2)}
    assert renamed <= names
