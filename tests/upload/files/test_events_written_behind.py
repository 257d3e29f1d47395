"""Small files committed together write their rows, events, change-log rows, audit rows
and folder bumps behind (services/common/write_behind.py): still exactly one of each per
file, the change log's numbers in the order of the outbox's events, every folder bumped;
two of them clashing on one name still make one file, the other refused by name."""

from __future__ import annotations

import asyncio

import grpc
from sqlalchemy import select
from support.grpc_errors import error_info
from upload.tree_helpers import folder, share
from upload.version_helpers import content_events, new_file

from services.common.audit.models import audit_events
from services.upload.models import ChangeRow, FileRow, UploadRow


async def test_racing_small_files_log_each_change_once_in_event_order(cluster, sessions) -> None:
    alice = cluster["alice"]
    team = await folder(alice, "team")
    await share(alice, team, "bob")
    async with sessions() as session:
        listed_before = (await session.get(FileRow, team)).children_version
    made = await asyncio.gather(
        *(new_file(alice, bytes([i]) * 100, f"{i}.txt", team) for i in range(24))
    )
    ids = {m.upload.file_id for m in made}
    async with sessions() as session:
        changes = (
            await session.execute(
                select(ChangeRow.file_id, ChangeRow.user_id, ChangeRow.seq)
                .where(ChangeRow.event_type == "file.content.updated")
                .order_by(ChangeRow.seq, ChangeRow.user_id)
            )
        ).all()
        audited = (
            await session.execute(
                select(audit_events.c.target_id).where(
                    audit_events.c.action == "file.content.updated"
                )
            )
        ).all()
        listed_after = (await session.get(FileRow, team)).children_version
    events = await content_events(cluster.settings.database_url)
    in_event_order = [e.aggregate_id for e in events if e.aggregate_id in ids]
    assert sorted(in_event_order) == sorted(ids)  # one event a file
    # Each file one number, logged for both users; numbers in the events' order.
    assert [c.user_id for c in changes if c.file_id in ids] == ["alice", "bob"] * 24
    by_seq = [c.file_id for c in changes if c.file_id in ids and c.user_id == "alice"]
    assert by_seq == in_event_order
    seqs = [c.seq for c in changes if c.file_id in ids and c.user_id == "alice"]
    assert len(set(seqs)) == 24
    assert sorted(target for (target,) in audited if target in ids) == sorted(ids)
    assert listed_after > listed_before


async def test_racing_new_files_of_one_name_make_one_file(cluster, sessions) -> None:
    """Sixteen new files named alike in one folder, sent at once (they commit in groups,
    whose file rows are written at the group's end): exactly one is stored under the name,
    with its upload and its one event; every other is NAME_TAKEN and stores nothing."""
    alice = cluster["alice"]
    team = await folder(alice, "same-name")
    # The first file commits alone; the sixteen arrive meanwhile and commit together.
    sent = await asyncio.gather(
        new_file(alice, b"first", "first.txt", team),
        *(new_file(alice, bytes([i]) * 100, "report.txt", team) for i in range(16)),
        return_exceptions=True,
    )
    assert not isinstance(sent[0], BaseException)
    made = [r for r in sent[1:] if not isinstance(r, BaseException)]
    refused = [r for r in sent[1:] if isinstance(r, BaseException)]
    assert len(made) == 1
    for exc in refused:
        assert isinstance(exc, grpc.aio.AioRpcError), exc
        assert (exc.code(), error_info(exc).reason) == (
            grpc.StatusCode.ALREADY_EXISTS,
            "NAME_TAKEN",
        )
    (winner,) = made
    async with sessions() as session:
        named = (
            await session.execute(
                select(FileRow.id).where(FileRow.parent_id == team, FileRow.name == "report.txt")
            )
        ).all()
        stored = (
            await session.execute(
                select(UploadRow.id).where(
                    UploadRow.folder_id == team, UploadRow.name == "report.txt"
                )
            )
        ).all()
    assert named == [(winner.file.file_id,)]
    assert stored == [(winner.upload.upload_id,)]
    events = await content_events(cluster.settings.database_url)
    assert [e.aggregate_id for e in events if e.aggregate_id in {winner.file.file_id}] == [
        winner.file.file_id
    ]
    assert not [e for e in events if e.file_content_updated.name == "report.txt"][1:]
