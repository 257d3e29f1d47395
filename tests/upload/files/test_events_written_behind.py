"""Small files committed together write their events, change-log rows, audit rows and
folder bumps behind (services/common/write_behind.py): still exactly one of each per file,
the change log's numbers in the order of the outbox's events, every folder bumped."""

from __future__ import annotations

import asyncio

from sqlalchemy import select
from upload.tree_helpers import folder, share
from upload.version_helpers import content_events, new_file

from services.common.audit.models import audit_events
from services.upload.models import ChangeRow, FileRow


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
