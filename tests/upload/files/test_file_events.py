"""Invariant 6: every metadata change bumps the file's version by one and writes its outbox
event (same version, idempotency key, dedupe key, correlation id, audience) in the same
transaction; a refused change writes neither."""

from __future__ import annotations

import grpc
from serentak.events.v1 import events_pb2
from serentak.upload.v1 import upload_pb2
from sqlalchemy import select
from upload.upload_helpers import expect_error

from services.common.db import create_engine, session_factory
from services.common.outbox.models import outbox_events


async def _events_for(database_url: str, aggregate_id: str) -> list[events_pb2.Event]:
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            rows = (
                await session.execute(
                    select(outbox_events.c.event)
                    .where(outbox_events.c.aggregate_id == aggregate_id)
                    .order_by(outbox_events.c.id)
                )
            ).scalars()
            return [events_pb2.Event.FromString(r) for r in rows]
    finally:
        await engine.dispose()


async def test_each_change_bumps_version_once_with_its_event(cluster, database_url) -> None:
    alice = cluster["alice"]
    files = alice.files
    target = await files.CreateFolder(
        upload_pb2.CreateFolderRequest(name="archive"), metadata=alice.md()
    )
    item = await files.CreateFolder(
        upload_pb2.CreateFolderRequest(name="draft"), metadata=alice.md()
    )
    f = item.file_id

    def steps(v: int) -> list[tuple[str, object]]:
        return [
            (
                "file.renamed",
                upload_pb2.RenameFileRequest(file_id=f, new_name="final", expected_version=v),
            ),
            (
                "file.moved",
                upload_pb2.MoveFileRequest(
                    file_id=f, new_parent_id=target.file_id, expected_version=v
                ),
            ),
            (
                "file.shared",
                upload_pb2.ShareFileRequest(
                    file_id=f, user_id="bob", role=upload_pb2.ROLE_EDITOR, expected_version=v
                ),
            ),
            (
                "file.unshared",
                upload_pb2.UnshareFileRequest(file_id=f, user_id="bob", expected_version=v),
            ),
            ("file.deleted", upload_pb2.DeleteFileRequest(file_id=f, expected_version=v)),
            ("file.restored", upload_pb2.RestoreFileRequest(file_id=f, expected_version=v)),
        ]

    rpc = {
        "file.renamed": files.RenameFile,
        "file.moved": files.MoveFile,
        "file.shared": files.ShareFile,
        "file.unshared": files.UnshareFile,
        "file.deleted": files.DeleteFile,
        "file.restored": files.RestoreFile,
    }
    version = item.version
    before = await _events_for(database_url, f)
    for step in range(len(steps(0))):
        expected_type, stale_request = steps(version + 5)[step]
        cid = f"corr-{expected_type}"
        # A stale expected_version is refused and leaves no trace: no event, no bump.
        await expect_error(
            rpc[expected_type](stale_request, metadata=alice.md()),
            grpc.StatusCode.ABORTED,
            "VERSION_MISMATCH",
        )
        assert len(await _events_for(database_url, f)) == len(before)
        assert (
            await files.GetFile(upload_pb2.GetFileRequest(file_id=f), metadata=alice.md())
        ).version == version

        _, request = steps(version)[step]
        changed = await rpc[expected_type](request, metadata=alice.md(**{"x-correlation-id": cid}))
        assert changed.version == version + 1
        after = await _events_for(database_url, f)
        assert len(after) == len(before) + 1
        event = after[-1]
        assert event.event_type == expected_type
        assert event.version == changed.version
        assert event.aggregate_id == f and event.tenant_id == "acme"
        assert event.actor_user_id == "alice"
        assert event.idempotency_key and event.dedupe_key and event.event_id
        assert event.correlation_id == cid
        assert "alice" in event.audience_user_ids
        version, before = changed.version, after

    versions = [e.version for e in before]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert len({e.event_id for e in before}) == len(before)
