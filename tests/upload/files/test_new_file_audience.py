"""A new file's audience and the folder it goes into are read once per transaction
(services/upload/files/permissions.py `new_file_audience`, `writable_folder`): the same
users as the full `audience` read, for the files a group commit stores together, and a new
transaction reads them afresh."""

from __future__ import annotations

from serentak.upload.v1 import upload_pb2
from sqlalchemy import select
from upload.tree_helpers import folder, share
from upload.version_helpers import new_file

from services.common.auth import Identity
from services.upload.files.permissions import audience, new_file_audience, writable_folder
from services.upload.models import FileRow, ShareRow, utcnow


async def test_a_new_files_audience_is_the_full_audience(cluster, sessions) -> None:
    alice = cluster["alice"]
    team = await folder(alice, "team")
    sub = await folder(alice, "sub", team)
    await share(alice, team, "carol")
    await share(alice, sub, "dave", upload_pb2.ROLE_VIEWER)
    other = await folder(alice, "other")
    await share(alice, other, "erin")  # a sibling's share reaches nobody here
    made = (await new_file(alice, b"x" * 100, "a.txt", sub)).upload.file_id
    async with sessions() as session:
        file = await session.get(FileRow, made)
        assert await new_file_audience(session, file) == await audience(session, file)
        assert await new_file_audience(session, file) == ["alice", "carol", "dave"]


async def test_one_transaction_reads_them_once_and_the_next_reads_again(cluster, sessions) -> None:
    alice = cluster["alice"]
    team = await folder(alice, "team")
    first = (await new_file(alice, b"1" * 100, "1.txt", team)).upload.file_id
    identity = Identity(tenant_id="acme", user_id="alice")
    async with sessions() as session:
        file = await session.get(FileRow, first)
        assert await new_file_audience(session, file) == ["alice"]
        held, role = await writable_folder(session, identity, team)
        # A share made in the same transaction (no unit of a group makes one): not seen.
        session.add(
            ShareRow(
                file_id=team,
                user_id="carol",
                role="editor",
                granted_by="alice",
                granted_at=utcnow(),
            )
        )
        await session.flush()
        assert await audience(session, file) == ["alice", "carol"]
        assert await new_file_audience(session, file) == ["alice"]
        assert await writable_folder(session, identity, team) == (held, role)
        await session.rollback()
    await share(alice, team, "carol")
    async with sessions() as session:
        file = await session.get(FileRow, first)
        assert await new_file_audience(session, file) == ["alice", "carol"]
        folder_row, _ = await writable_folder(session, identity, team)
        version = await session.scalar(select(FileRow.version).where(FileRow.id == team))
        assert folder_row.version == version


async def test_the_folder_read_gives_an_editors_role_and_the_owners_audience(
    cluster, sessions
) -> None:
    """`writable_folder` reads the folder's chain with every share on it once: the
    caller's role (an editor through a share above) and the audience of a new file of the
    folder's owner there, the same as `audience` reads for a file made in it."""
    alice = cluster["alice"]
    team = await folder(alice, "team")
    sub = await folder(alice, "sub", team)
    await share(alice, team, "carol")
    await share(alice, sub, "dave", upload_pb2.ROLE_VIEWER)
    made = (await new_file(alice, b"x" * 100, "a.txt", sub)).upload.file_id
    carol = Identity(tenant_id="acme", user_id="carol")
    async with sessions() as session:
        held, role = await writable_folder(session, carol, sub)
        file = await session.get(FileRow, made)
        assert (held.id, role) == (sub, "editor")
        # Given by the folder's read (its memo), the same as the full read below.
        assert await new_file_audience(session, file) == ["alice", "carol", "dave"]
        assert await audience(session, file) == ["alice", "carol", "dave"]
