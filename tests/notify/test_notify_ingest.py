"""Ingest: idempotent by event_id, version order per file, exactly one notification per
(user, file, version), identity, bad input."""

from __future__ import annotations

import random
from collections import Counter

import grpc
import pytest
from notify.harness import error_reason, event, user_md
from serentak.events.v1 import events_pb2
from serentak.notify.v1 import notify_pb2

USERS = ("alice", "bob", "carol")


async def test_thousand_events_redelivered_give_one_notification_per_user_file_version(notify):
    rng = random.Random(7)
    files = [f"f-{i}" for i in range(200)]
    events = [
        event(f, v, actor=rng.choice(USERS), name=f"{f}-v{v}") for f in files for v in range(1, 6)
    ]
    deliveries = [ev for ev in events for _ in range(rng.randint(1, 5))]
    rng.shuffle(deliveries)

    responses = await notify.ingest_all(deliveries, parallel=24)
    await notify.settled()

    outcomes = Counter(r.outcome for r in responses)
    assert outcomes[notify_pb2.INGEST_OUTCOME_DUPLICATE] == len(deliveries) - len(events)
    assert sum(r.duplicate for r in responses) == len(deliveries) - len(events)
    assert outcomes[notify_pb2.INGEST_OUTCOME_SKIPPED_OLD] == 0
    for user in USERS:
        got = await notify.all_notifications(user)
        keys = [(n.file_id, n.version) for n in got]
        expected = {(e.aggregate_id, e.version) for e in events if e.actor_user_id != user}
        assert len(keys) == len(set(keys)), "a (user, file, version) was notified twice"
        assert set(keys) == expected
        assert await notify.unread(user) == len(expected)
        # Per-user order: within each file, stream order follows version order.
        by_seq = sorted(got, key=lambda n: int(n.cursor))
        last: dict[str, int] = {}
        for n in by_seq:
            assert n.version > last.get(n.file_id, 0)
            last[n.file_id] = n.version


async def test_out_of_order_versions_wait_for_their_turn_and_old_ones_are_skipped(notify):
    v1, v2, v3 = (event("f-ooo", v, name=f"v{v}") for v in (1, 2, 3))
    assert (await notify.ingest(v3)).outcome == notify_pb2.INGEST_OUTCOME_PARKED
    assert (await notify.ingest(v2)).outcome == notify_pb2.INGEST_OUTCOME_PARKED
    await notify.settled()
    assert await notify.all_notifications("alice") == []

    applied = await notify.ingest_settled(v1)
    assert applied.outcome == notify_pb2.INGEST_OUTCOME_APPLIED
    assert applied.notifications_written == 6  # 3 versions x (alice, bob); carol acted

    assert (await notify.ingest(v2)).outcome == notify_pb2.INGEST_OUTCOME_DUPLICATE
    late = event("f-ooo", 2, name="late copy")  # same version, another event id
    assert (await notify.ingest(late)).outcome == notify_pb2.INGEST_OUTCOME_SKIPPED_OLD
    got = sorted(await notify.all_notifications("alice"), key=lambda n: int(n.cursor))
    assert [(n.version, n.file_name) for n in got] == [(1, "v1"), (2, "v2"), (3, "v3")]


async def test_concurrent_out_of_order_bursts_apply_every_version_once(notify):
    rng = random.Random(11)
    events = [event(f"f-race-{f}", v) for f in range(10) for v in range(1, 21)]
    for _round in range(3):
        batch = [ev for ev in events for _ in range(rng.randint(1, 3))]
        rng.shuffle(batch)
        await notify.ingest_all(batch, parallel=32)
    await notify.settled()
    got = await notify.all_notifications("alice")
    assert sorted((n.file_id, n.version) for n in got) == sorted(
        (e.aggregate_id, e.version) for e in events
    )


async def test_thousand_collaborators_on_one_file(notify_factory):
    users = [f"u{i:04d}" for i in range(1000)]
    async with notify_factory(extra_users=users) as notify:
        ev = event("f-big", 1, actor="u0000", audience=users)
        resp = await notify.ingest_settled(ev)
        assert resp.notifications_written == 999
        assert (await notify.ingest(ev)).duplicate
        assert await notify.all_notifications("u0000") == []
        for user in random.Random(3).sample(users[1:], 25):
            got = await notify.all_notifications(user)
            assert [(n.file_id, n.version, n.user_id) for n in got] == [("f-big", 1, user)]
            assert await notify.unread(user) == 1


async def test_ingest_is_for_services_only(notify):
    request = notify_pb2.IngestRequest(event=event("f-auth", 1))
    with pytest.raises(grpc.aio.AioRpcError) as user_call:
        await notify.stub.Ingest(request, metadata=user_md("alice"))
    assert user_call.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert error_reason(user_call.value) == "SERVICE_REQUIRED"
    with pytest.raises(grpc.aio.AioRpcError) as anonymous:
        await notify.stub.Ingest(request)
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
    await notify.settled()
    assert await notify.all_notifications("alice") == []


async def test_a_folder_shared_with_10000_users_and_its_owner_is_one_accepted_event(notify):
    """The upload service puts every collaborator and the owner in one event's audience:
    10,001 users for a folder shared with 10,000 (the largest audience issue 37 names)
    must be accepted, or the relay would dead-letter it and nobody would hear of it."""
    ev = event("f-wide", 1, audience=["alice", *(f"u{i}" for i in range(10_000))])
    assert await notify.ingest(ev)
    await notify.settled()
    assert [n.file_id for n in await notify.all_notifications("alice")] == ["f-wide"]


@pytest.mark.parametrize(
    ("field", "mutate"),
    [
        ("event.event_id", lambda e: e.ClearField("event_id")),
        ("event.aggregate_id", lambda e: e.ClearField("aggregate_id")),
        ("event.tenant_id", lambda e: e.ClearField("tenant_id")),
        ("event.version", lambda e: setattr(e, "version", 0)),
        ("event.event_id", lambda e: setattr(e, "event_id", "x" * 500)),
        # The same principal limit as the upload service's ShareFile (64).
        ("event.tenant_id", lambda e: setattr(e, "tenant_id", "t" * 65)),
        ("event.audience_user_ids", lambda e: e.audience_user_ids.append("u" * 65)),
        # Past SERENTAK_MAX_AUDIENCE (20,000).
        (
            "event.audience_user_ids",
            lambda e: e.audience_user_ids.extend(f"u{i}" for i in range(20_000)),
        ),
        # A payload about another file than the event's aggregate: its version would be
        # ordered among the wrong file's versions.
        (
            "event.file_content_updated.file_id",
            lambda e: setattr(e.file_content_updated, "file_id", "f-other"),
        ),
        (
            "event.folder_created.folder_id",
            lambda e: e.folder_created.CopyFrom(
                events_pb2.FolderCreated(folder_id="d-other", name="x")
            ),
        ),
    ],
)
async def test_bad_events_are_invalid_argument_naming_the_field(notify, field, mutate):
    ev = event("f-bad", 1)
    mutate(ev)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await notify.ingest(ev)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(err.value) == "INVALID_EVENT"
    assert field in (err.value.details() or "")
    await notify.settled()
    assert await notify.all_notifications("alice") == []  # nothing stored
