"""IngestBatch: several events in one call and one transaction, each handled as Ingest
would (idempotent by event_id, version order per file), identity, bad input."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest
from notify.harness import SERVICE, error_reason, event, user_md
from serentak.credentials import ClientSecurity, ClientToken
from serentak.notify.v1 import notify_pb2

from services.common.outbox import subscribers

pb = notify_pb2


async def ingest_batch(notify, events, metadata=SERVICE) -> list[int]:  # type: ignore[no-untyped-def]
    resp = await notify.stub.IngestBatch(
        notify_pb2.IngestBatchRequest(events=events), metadata=metadata
    )
    return [r.outcome for r in resp.results]


async def test_a_batch_is_handled_event_by_event_in_order(notify):
    v1, v2, v3 = (event("f-batch", v, name=f"v{v}") for v in (1, 2, 3))
    late = event("f-batch", 1, name="late copy")  # an accepted version, another event id
    outcomes = await ingest_batch(notify, [v1, v3, v2, v2, late])
    assert outcomes == [
        pb.INGEST_OUTCOME_APPLIED,
        pb.INGEST_OUTCOME_PARKED,
        pb.INGEST_OUTCOME_APPLIED,  # and v3 with it
        pb.INGEST_OUTCOME_DUPLICATE,
        pb.INGEST_OUTCOME_SKIPPED_OLD,
    ]
    # The same events again, one by one: all known.
    for ev in (v1, v2, v3):
        assert (await notify.ingest(ev)).outcome == pb.INGEST_OUTCOME_DUPLICATE
    await notify.settled()
    for user in ("alice", "bob"):
        got = sorted(await notify.all_notifications(user), key=lambda n: int(n.cursor))
        assert [(n.version, n.file_name) for n in got] == [(1, "v1"), (2, "v2"), (3, "v3")]


async def test_racing_batches_across_files_write_every_version_once(notify):
    # Overlapping, shuffled batches over 6 files race each other: aggregates are locked in
    # one order whatever order a batch lists them in, so nothing deadlocks for good, and
    # each (user, file, version) is written exactly once, in version order per file.
    rng = random.Random(5)
    events = [event(f"f-rb-{f}", v) for f in range(6) for v in range(1, 9)]
    batches = []
    for _ in range(12):
        batch = rng.sample(events, 12)
        rng.shuffle(batch)
        batches.append(batch)
    batches.append(events)  # and one with everything, in order
    await asyncio.gather(*(ingest_batch(notify, b) for b in batches))
    await notify.settled()
    for user in ("alice", "bob"):
        got = sorted(await notify.all_notifications(user), key=lambda n: int(n.cursor))
        assert sorted((n.file_id, n.version) for n in got) == sorted(
            (e.aggregate_id, e.version) for e in events
        )
        last: dict[str, int] = {}
        for n in got:
            assert n.version == last.get(n.file_id, 0) + 1
            last[n.file_id] = n.version


async def test_ingest_batch_is_for_services_only(notify):
    batch = [event("f-batch-auth", 1)]
    with pytest.raises(grpc.aio.AioRpcError) as user_call:
        await ingest_batch(notify, batch, metadata=user_md("alice"))
    assert user_call.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert error_reason(user_call.value) == "SERVICE_REQUIRED"
    with pytest.raises(grpc.aio.AioRpcError) as anonymous:
        await ingest_batch(notify, batch, metadata=())
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # Nothing was stored: the event is new to a service caller.
    assert await ingest_batch(notify, batch) == [pb.INGEST_OUTCOME_APPLIED]


async def test_bad_batches_are_invalid_argument_and_store_nothing(notify_factory):
    async with notify_factory(ingest_batch_max=3) as notify:
        good = event("f-batch-bad", 1)
        bad = event("f-batch-bad", 2)
        bad.ClearField("tenant_id")
        cases = [
            ([], "events"),
            ([event("f-batch-many", v) for v in range(1, 5)], "events"),
            ([good, bad], "event.tenant_id"),
        ]
        for batch, field in cases:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await ingest_batch(notify, batch)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error_reason(err.value) == "INVALID_EVENT"
            assert field in (err.value.details() or "")
        # The valid event of the rejected batch was not stored.
        assert await ingest_batch(notify, [good]) == [pb.INGEST_OUTCOME_APPLIED]


async def test_the_relays_grpc_subscriber_sends_batches_under_the_size_limit(notify, monkeypatch):
    # The upload service's relay publishes through this subscriber: small size limit, so
    # 12 events go in several IngestBatch calls; each lands once, in order.
    monkeypatch.setattr(subscribers, "MAX_BATCH_BYTES", 600)
    security = ClientSecurity(token=ClientToken(token="dev-service-upload"))
    subscriber = subscribers.GrpcIngestSubscriber(
        f"127.0.0.1:{notify.service.app.bound_port}", security
    )
    try:
        events = [event("f-relay", v, name=f"v{v}") for v in range(1, 13)]
        assert len(list(subscribers._by_size(events))) > 2
        assert await subscriber.publish_many(events)
        assert await subscriber.publish_many(events)  # redelivered: duplicates, no effect
    finally:
        await subscriber.close()
    await notify.settled()
    got = sorted(await notify.all_notifications("alice"), key=lambda n: int(n.cursor))
    assert [n.version for n in got] == list(range(1, 13))


async def test_one_job_per_batch_continues_past_its_limit_in_order(notify_factory):
    # A fan-out job writes at most 2 events here: the one job a batch of 7 queues per
    # file hands the rest to continuation jobs; racing batches over 3 files (and a
    # replayed batch) still give every (user, file, version) once, in version order.
    async with notify_factory(fanout_batch_max=2) as notify:
        events = {f: [event(f"f-cont-{f}", v) for v in range(1, 8)] for f in range(3)}
        rng = random.Random(8)
        batches = [list(evs) for evs in events.values()]
        mixed = [ev for evs in events.values() for ev in evs]
        rng.shuffle(mixed)
        batches += [mixed[:10], mixed[10:]]
        await asyncio.gather(*(ingest_batch(notify, b) for b in batches))
        await notify.settled()
        for user in ("alice", "bob"):
            got = sorted(await notify.all_notifications(user), key=lambda n: int(n.cursor))
            assert [int(n.cursor) for n in got] == list(range(1, 22))
            for f in range(3):
                versions = [n.version for n in got if n.file_id == f"f-cont-{f}"]
                assert versions == list(range(1, 8))
