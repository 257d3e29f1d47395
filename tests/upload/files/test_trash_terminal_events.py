"""The trash purge ends each purged item's aggregate with `file.purged`
(services/upload/files/trash.py): in the purge's own transaction, at the version after the
item's last event, told to nobody; a rolled-back purge leaves neither the purge nor its
event. SQLite and PostgreSQL."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import pytest
from serentak.events.v1 import events_pb2
from serentak.upload.v1 import upload_pb2
from sqlalchemy import func, select
from upload.tree_helpers import folder, share

from services.common.outbox.models import outbox_events
from services.upload.files.trash import TrashPurged, purge_item, purge_trash
from services.upload.models import FileRow, utcnow

DAY = timedelta(days=1)


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    # The periodic sweeps stay out of the way: the tests run the purge themselves.
    return {
        "reclaim_interval_seconds": 3600,
        "trash_purge_interval_seconds": 3600,
        "trash_retention_days": 30,
    }


class Abandoned(Exception):
    """Raised inside the purge's transaction to roll it back."""


async def _put(client, name: str, folder_id: str = "") -> str:
    done = await client.uploads.UploadFile(
        upload_pb2.UploadFileRequest(
            new_file=upload_pb2.NewFileTarget(folder_id=folder_id, name=name),
            data=os.urandom(100),
        ),
        metadata=client.metadata,
    )
    return done.upload.file_id


async def _delete(client, file_id: str) -> None:
    await client.files.DeleteFile(
        upload_pb2.DeleteFileRequest(file_id=file_id), metadata=client.metadata
    )


async def _events(session, event_type: str | None = None) -> dict[str, list[events_pb2.Event]]:
    """The outbox's events by aggregate, in the order the relay publishes them."""
    stmt = select(outbox_events.c.event).order_by(outbox_events.c.id)
    if event_type is not None:
        stmt = stmt.where(outbox_events.c.event_type == event_type)
    found: dict[str, list[events_pb2.Event]] = {}
    for blob in (await session.execute(stmt)).scalars():
        event = events_pb2.Event.FromString(blob)
        found.setdefault(event.aggregate_id, []).append(event)
    return found


async def test_each_purged_item_ends_with_file_purged_after_its_last_event(
    cluster, sessions
) -> None:
    alice = cluster["alice"]
    box = await folder(alice, "box")
    inner = await _put(alice, "inner.bin", box)  # live under the deleted folder
    loose = await _put(alice, "loose.bin")
    kept = await _put(alice, "kept.bin")
    await share(alice, loose, "bob")
    await _delete(alice, box)
    await _delete(alice, loose)
    result = await purge_trash(sessions, timedelta(days=30), now=utcnow() + 31 * DAY)
    assert result.items == 2
    async with sessions() as session:
        events = await _events(session)
    for item, kind in ((box, "folder"), (inner, "file"), (loose, "file")):
        stream = events[item]
        # Versions 1, 2, ... without a hole (notify applies them in this order), the
        # purge's event last: nothing can follow it.
        assert [e.version for e in stream] == list(range(1, len(stream) + 1)), item
        last = stream[-1]
        assert last.event_type == "file.purged"
        assert last.WhichOneof("payload") == "file_purged"
        assert last.file_purged.file_id == last.aggregate_id == item
        assert last.aggregate_type == kind
        assert list(last.audience_user_ids) == []  # told to nobody
        assert [e.event_type for e in stream].count("file.purged") == 1
    # The live file under the folder was announced deleted first (to its audience).
    assert [e.event_type for e in events[inner][-2:]] == ["file.deleted", "file.purged"]
    assert "file.purged" not in [e.event_type for e in events[kept]]


async def test_a_rolled_back_purge_leaves_no_terminal_event(cluster, sessions) -> None:
    alice = cluster["alice"]
    loose = await _put(alice, "loose.bin")
    await _delete(alice, loose)
    cutoff = utcnow() + DAY
    with pytest.raises(Abandoned):
        async with sessions() as session, session.begin():
            assert await purge_item(session, loose, cutoff, TrashPurged())
            # Written by the purge's own transaction ...
            assert list(await _events(session, "file.purged")) == [loose]
            raise Abandoned
    # ... so the rollback took it with the purge: the item is still in the trash.
    async with sessions() as session:
        assert await _events(session, "file.purged") == {}
        assert await session.scalar(select(func.count()).select_from(outbox_events)) == 2
        row = await session.get(FileRow, loose)
        assert row is not None and row.deleted_at is not None
    # The purge that commits writes it once.
    assert (await purge_trash(sessions, timedelta(0), now=cutoff)).items == 1
    async with sessions() as session:
        purged = await _events(session, "file.purged")
    assert [(e.aggregate_id, e.version) for e in purged[loose]] == [(loose, 3)]
