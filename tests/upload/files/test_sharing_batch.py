"""ShareFileBatch (issue 37, part 4): many grants as one change of the file, with ShareFile's
access rules. One version and one outbox event (every collaborator in its audience, the
grants in its payload) per call that changes something, none for a call that changes
nothing; precise refusals that write nothing; racing grants of one file never make a share
twice. SQLite and PostgreSQL. The SDK's 1,000 grants reaching 1,000 inboxes:
tests/client/sdk/test_sdk_client.py."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from serentak.events.v1 import events_pb2
from serentak.upload.v1 import upload_pb2
from sqlalchemy import select
from upload.upload_helpers import expect_error

from services.common.outbox.models import outbox_events
from services.upload.models import ShareRow

IA, ND, PD, AB = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.ABORTED,
)
V, E = upload_pb2.ROLE_VIEWER, upload_pb2.ROLE_EDITOR


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    return {"share_batch_max": 50}


def batch(file_id: str, *grants: tuple[str, int], expected_version: int = 0) -> Any:
    return upload_pb2.ShareFileBatchRequest(
        file_id=file_id,
        grants=[upload_pb2.ShareGrant(user_id=u, role=r) for u, r in grants],  # type: ignore[arg-type]
        expected_version=expected_version,
    )


async def events_of(sessions, file_id: str) -> list[events_pb2.Event]:
    async with sessions() as session:
        rows = await session.execute(
            select(outbox_events.c.event)
            .where(outbox_events.c.aggregate_id == file_id)
            .order_by(outbox_events.c.id)
        )
        return [events_pb2.Event.FromString(r) for r in rows.scalars()]


async def shares_of(sessions, file_id: str) -> dict[str, str]:
    async with sessions() as session:
        rows = await session.execute(select(ShareRow).where(ShareRow.file_id == file_id))
        return {r.user_id: r.role for r in rows.scalars()}


async def folder(cluster, name: str = "team") -> upload_pb2.File:
    alice = cluster["alice"]
    return await alice.files.CreateFolder(
        upload_pb2.CreateFolderRequest(name=name), metadata=alice.md()
    )


async def test_a_batch_is_one_version_and_one_event_told_to_every_collaborator(
    cluster, sessions
) -> None:
    alice = cluster["alice"]
    f = await folder(cluster)
    await alice.files.ShareFile(
        upload_pb2.ShareFileRequest(file_id=f.file_id, user_id="carol", role=V),
        metadata=alice.md(),
    )
    users = [f"u{i:02d}" for i in range(40)]
    resp = await alice.files.ShareFileBatch(
        batch(f.file_id, *[(u, E) for u in users], ("carol", E), expected_version=f.version + 1),
        metadata=alice.md(),
    )
    assert (resp.added, resp.changed, resp.unchanged) == (40, 1, 0)
    assert resp.file.version == f.version + 2 and resp.file.role == upload_pb2.ROLE_OWNER
    shares = await shares_of(sessions, f.file_id)
    assert shares == {**{u: "editor" for u in users}, "carol": "editor"}
    *_, ev = await events_of(sessions, f.file_id)
    assert (ev.event_type, ev.version, ev.actor_user_id) == (
        "file.shared",
        resp.file.version,
        "alice",
    )
    assert [(g.user_id, g.role) for g in ev.file_shared.grants] == sorted(
        [(u, "editor") for u in [*users, "carol"]]
    )
    assert ev.file_shared.user_id == ""  # several users: the grants say who
    assert list(ev.audience_user_ids) == sorted(["alice", "carol", *users])
    # The access rules read the new shares: carol is an editor of the folder now.
    seen = await cluster["carol"].files.GetFile(
        upload_pb2.GetFileRequest(file_id=f.file_id), metadata=cluster["carol"].md()
    )
    assert seen.role == upload_pb2.ROLE_EDITOR

    # The same batch again changes nothing: same version, no event, nobody told twice.
    again = await alice.files.ShareFileBatch(
        batch(f.file_id, *[(u, E) for u in users], ("carol", E)), metadata=alice.md()
    )
    assert (again.added, again.changed, again.unchanged) == (0, 0, 41)
    assert again.file.version == resp.file.version
    assert len(await events_of(sessions, f.file_id)) == 3  # created, shared, the batch

    # One changed grant among unchanged ones: its one user is named, as ShareFile does.
    one = await alice.files.ShareFileBatch(
        batch(f.file_id, ("u00", V), ("u01", E)), metadata=alice.md()
    )
    assert (one.added, one.changed, one.unchanged) == (0, 1, 1)
    *_, ev = await events_of(sessions, f.file_id)
    assert (ev.file_shared.user_id, ev.file_shared.role) == ("u00", "viewer")


async def test_refusals_are_precise_and_write_nothing(cluster, sessions) -> None:
    alice, bob, mallory = cluster["alice"], cluster["bob"], cluster["mallory"]
    f = await folder(cluster)
    fid = f.file_id
    cases = [
        (batch(fid), IA, "NO_GRANTS", "grants"),
        (batch(fid, *[(f"u{i}", V) for i in range(51)]), IA, "TOO_MANY_GRANTS", "grants"),
        (batch(fid, ("bob", V), ("bob", E)), IA, "DUPLICATE_GRANT", "grants[1].user_id"),
        (batch(fid, ("bob", V), ("alice", E)), IA, "INVALID_ARGUMENT", "grants[1].user_id"),
        (batch(fid, ("bob", upload_pb2.ROLE_OWNER)), IA, "INVALID_ARGUMENT", "grants[0].role"),
        (batch(fid, ("bob", V), ("", V)), IA, "INVALID_PRINCIPAL", "grants[1].user_id"),
        (batch(fid, ("b b", V)), IA, "INVALID_PRINCIPAL", "grants[0].user_id"),
        (batch("", ("bob", V)), IA, "INVALID_ID", "file_id"),
        (batch(fid, ("bob", V), expected_version=f.version + 5), AB, "VERSION_MISMATCH", None),
    ]
    for request, code, reason, field in cases:
        info = await expect_error(
            alice.files.ShareFileBatch(request, metadata=alice.md()), code, reason
        )
        if field is not None:
            assert info.metadata["field"] == field, (reason, info.metadata)
    # Only the owner shares; another tenant does not see the folder at all.
    await alice.files.ShareFile(
        upload_pb2.ShareFileRequest(file_id=fid, user_id="bob", role=E), metadata=alice.md()
    )
    await expect_error(
        bob.files.ShareFileBatch(batch(fid, ("carol", V)), metadata=bob.md()),
        PD,
        "INSUFFICIENT_ROLE",
    )
    await expect_error(
        mallory.files.ShareFileBatch(batch(fid, ("eve", V)), metadata=mallory.md()),
        ND,
        "FILE_NOT_FOUND",
    )
    assert await shares_of(sessions, fid) == {"bob": "editor"}
    assert [e.event_type for e in await events_of(sessions, fid)] == [
        "folder.created",
        "file.shared",
    ]


async def test_racing_grants_of_one_file_make_each_share_once(cluster, sessions) -> None:
    alice = cluster["alice"]
    for round_ in range(3):
        f = await folder(cluster, f"race-{round_}")
        users = [f"r{i:02d}" for i in range(30)]
        # Overlapping batches and single shares of the same users, all at once.
        calls = [
            alice.files.ShareFileBatch(
                batch(f.file_id, *[(u, E) for u in users[i : i + 10]]), metadata=alice.md()
            )
            for i in range(0, 21, 5)
        ] + [
            alice.files.ShareFile(
                upload_pb2.ShareFileRequest(file_id=f.file_id, user_id=u, role=E),
                metadata=alice.md(),
            )
            for u in users[::7]
        ]
        answers = await asyncio.gather(*calls)
        batches, singles = answers[:5], answers[5:]
        # No call failed (a share inserted twice would have been INTERNAL), and each user
        # holds exactly one share.
        assert await shares_of(sessions, f.file_id) == dict.fromkeys(users, "editor")
        assert all(a.added + a.changed + a.unchanged == 10 for a in batches)
        assert len(users) - len(singles) <= sum(a.added for a in batches) <= len(users)
        # One version and one event per call that changed something (ShareFile always
        # does), in version order after the folder's creation.
        events = await events_of(sessions, f.file_id)
        changing = sum(1 for a in batches if a.added or a.changed) + len(singles)
        assert len(events) == 1 + changing
        assert [e.version for e in events] == list(range(1, len(events) + 1))
        # A batch names each user it granted; no user was granted by two batches.
        by_batches = [g.user_id for e in events for g in e.file_shared.grants]
        assert len(by_batches) == len(set(by_batches)) == sum(a.added for a in batches)
