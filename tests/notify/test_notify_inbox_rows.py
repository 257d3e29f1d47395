"""The inbox rows an accepting Ingest writes and reads (`inbox_rows.py`): a second event
parked for a version goes old when the chain takes that version (read with the insert on
PostgreSQL, with and without the `behind` check), and an event id already stored is a
duplicate whatever version it claims."""

from __future__ import annotations

from notify.harness import SERVICE, NotifyHarness, event
from serentak.events.v1 import events_pb2
from serentak.notify.v1 import notify_pb2 as pb
from sqlalchemy import select

from services.notify.models import InboxEvent, InboxStatus


async def _statuses(notify: NotifyHarness, *event_ids: str) -> list[str]:
    async with notify.parts.sessions() as session:
        rows = dict(
            (
                await session.execute(
                    select(InboxEvent.event_id, InboxEvent.status).where(
                        InboxEvent.event_id.in_(event_ids)
                    )
                )
            ).all()
        )
    return [rows[event_id] for event_id in event_ids]


async def _versions(notify: NotifyHarness, user: str) -> list[tuple[int, str]]:
    got = sorted(await notify.all_notifications(user), key=lambda n: int(n.cursor))
    return [(n.version, n.file_name) for n in got]


async def test_a_second_parked_event_for_a_version_goes_old_when_the_chain_takes_it(notify):
    first = event("f-stale", 2, name="first v2", event_id="f-stale-v2-a")
    second = event("f-stale", 2, name="second v2", event_id="f-stale-v2-b")
    v3 = event("f-stale", 3, name="v3")
    for ev in (first, second, v3):
        assert (await notify.ingest(ev)).outcome == pb.INGEST_OUTCOME_PARKED

    resp = await notify.ingest_settled(event("f-stale", 1, name="v1"))

    assert resp.outcome == pb.INGEST_OUTCOME_APPLIED
    assert resp.notifications_written == 6  # v1, v2 (the first), v3 x (alice, bob)
    assert await _versions(notify, "alice") == [(1, "v1"), (2, "first v2"), (3, "v3")]
    assert await _statuses(notify, first.event_id, second.event_id, v3.event_id) == [
        InboxStatus.NOTIFIED,
        InboxStatus.SKIPPED_OLD,
        InboxStatus.NOTIFIED,
    ]


async def test_a_batchs_second_accept_of_a_file_drains_and_skips_the_same_way(notify):
    # v2 is the batch's second event accepted for the file: its read of the parked rows
    # skips the check for other transactions' pending jobs (it would see v1's own).
    first = event("f-stale-b", 3, name="first v3", event_id="f-stale-b-v3-a")
    second = event("f-stale-b", 3, name="second v3", event_id="f-stale-b-v3-b")
    for ev in (first, second):
        assert (await notify.ingest(ev)).outcome == pb.INGEST_OUTCOME_PARKED
    v1, v2 = event("f-stale-b", 1, name="v1"), event("f-stale-b", 2, name="v2")

    resp = await notify.stub.IngestBatch(pb.IngestBatchRequest(events=[v1, v2]), metadata=SERVICE)
    await notify.settled()

    assert [r.outcome for r in resp.results] == [pb.INGEST_OUTCOME_APPLIED] * 2
    assert [r.notifications_written for r in resp.results] == [2, 4]  # v2 takes v3 along
    assert await _versions(notify, "bob") == [(1, "v1"), (2, "v2"), (3, "first v3")]
    assert await _statuses(notify, first.event_id, second.event_id) == [
        InboxStatus.NOTIFIED,
        InboxStatus.SKIPPED_OLD,
    ]


async def test_a_stored_event_id_is_a_duplicate_even_when_it_claims_the_next_version(notify):
    parked = event("f-dup", 3, event_id="f-dup-x")
    assert (await notify.ingest(parked)).outcome == pb.INGEST_OUTCOME_PARKED
    # The same id again, now claiming version 1 (next in line): stored already, so
    # nothing is accepted, however its insert and the read of the parked rows go.
    claim = events_pb2.Event()
    claim.CopyFrom(parked)
    claim.version = 1

    resp = await notify.ingest_settled(claim)

    assert resp.outcome == pb.INGEST_OUTCOME_DUPLICATE
    assert resp.notifications_written == 0
    assert await notify.all_notifications("alice") == []
    assert await _statuses(notify, parked.event_id) == [InboxStatus.PARKED]
    # Version 1 is still next: a real v1 is accepted (v2 is missing, so v3 waits).
    real = await notify.ingest_settled(event("f-dup", 1, name="v1"))
    assert real.outcome == pb.INGEST_OUTCOME_APPLIED
    assert real.notifications_written == 2
