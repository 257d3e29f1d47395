"""The fan-out on the job runtime: a redelivered or replayed job has no second effect,
parked events show in gauges, retention runs as a periodic job."""

from __future__ import annotations

import asyncio

from notify.harness import event, user_md
from serentak.notify.v1 import notify_pb2

from services.common.jobs import NewJob, enqueue
from services.notify import metrics
from services.notify.fanout_job import FANOUT_JOB, fanout_job
from services.notify.parked import sample_parked

DEADLINE_S = 30.0


async def _enqueue(notify, job: NewJob) -> None:
    async with notify.parts.sessions() as session, session.begin():
        await enqueue(session, job)
    notify.parts.runtime.wake()


async def test_redelivered_and_replayed_fanout_jobs_change_nothing(notify):
    events = [event("f-once", v, name=f"v{v}") for v in (1, 2, 3)]
    for ev in events:
        await notify.ingest(ev)
    await notify.settled()
    before = {u: await notify.all_notifications(u) for u in ("alice", "bob")}
    assert [sorted(n.version for n in got) for got in before.values()] == [[1, 2, 3]] * 2

    for ev in events:
        # The same job again (same idempotency key): acknowledged without running.
        await _enqueue(notify, fanout_job(ev))
        # A replay under a new key: runs, finds the event already notified, writes nothing.
        again = fanout_job(ev)
        await _enqueue(
            notify,
            NewJob(
                job_type=FANOUT_JOB,
                payload=again.payload,
                partition_key=again.partition_key,
                idempotency_key=f"replay:{ev.event_id}",
            ),
        )
    await notify.settled()
    for user, got in before.items():
        assert await notify.all_notifications(user) == got
        assert await notify.unread(user) == 3


async def test_many_files_fan_out_concurrently_and_each_stream_is_gapless(notify):
    # 60 files x 4 versions, ingested out of order: per-file version order in each
    # user's stream, and seq values 1..N with no gap (one commit at a time per user).
    events = [event(f"f-par-{f}", v) for f in range(60) for v in (4, 3, 2, 1)]
    for _round in range(2):
        await notify.ingest_all(events, parallel=24)
    await notify.settled()
    for user in ("alice", "bob"):
        got = sorted(await notify.all_notifications(user), key=lambda n: int(n.cursor))
        assert [int(n.cursor) for n in got] == list(range(1, len(events) + 1))
        last: dict[str, int] = {}
        for n in got:
            assert n.version == last.get(n.file_id, 0) + 1
            last[n.file_id] = n.version


async def test_parked_events_show_in_gauges_until_the_gap_fills(notify):
    assert (await notify.ingest(event("f-gap", 3))).outcome == notify_pb2.INGEST_OUTCOME_PARKED
    assert (await notify.ingest(event("f-gap", 2))).outcome == notify_pb2.INGEST_OUTCOME_PARKED
    assert (await notify.ingest(event("f-gap2", 5))).outcome == notify_pb2.INGEST_OUTCOME_PARKED
    stats = await sample_parked(notify.parts.sessions)
    assert (stats.events, stats.files) == (3, 2)
    assert stats.oldest_age_seconds >= 0
    assert metrics.PARKED_EVENTS._value.get() == 3
    assert metrics.PARKED_FILES._value.get() == 2

    assert (await notify.ingest(event("f-gap", 1))).outcome == notify_pb2.INGEST_OUTCOME_APPLIED
    stats = await sample_parked(notify.parts.sessions)
    assert (stats.events, stats.files) == (1, 1)
    await notify.settled()
    assert sorted(n.version for n in await notify.all_notifications("alice")) == [1, 2, 3]


async def test_retention_runs_as_a_periodic_job(notify_factory):
    # A test about time: the schedule ticks every 0.2 s and read rows expire after 0.05 s.
    async with notify_factory(retention_interval_seconds=0.2, read_retention_seconds=0.05) as n:
        await n.ingest_all([event(f"f-per-{i}", 1) for i in range(3)], parallel=1)
        await n.settled()
        alice = sorted(await n.all_notifications("alice"), key=lambda x: int(x.cursor))
        await n.stub.MarkRead(
            notify_pb2.MarkReadRequest(notification_ids=[alice[0].notification_id]),
            metadata=user_md("alice"),
        )
        deadline = asyncio.get_running_loop().time() + DEADLINE_S
        while len(await n.all_notifications("alice")) != 2:
            assert asyncio.get_running_loop().time() < deadline, "retention job never ran"
            await asyncio.sleep(0.05)  # poll interval of the wait, not synchronisation
        left = await n.all_notifications("alice")
        assert {x.notification_id for x in left} == {x.notification_id for x in alice[1:]}
        assert await n.unread("alice") == 2
        assert len(await n.all_notifications("bob")) == 3


async def test_a_chain_with_differing_audiences_is_written_once_in_order(notify_factory):
    async with notify_factory(extra_users=["dave"]) as notify:
        # v2..v6 park behind v1; v1 accepts them all, so one fan-out job writes the chain in
        # one transaction (on PostgreSQL: the two-statement batch path; a chain holding a
        # rename takes the per-event path). Each user gets exactly the versions they were in
        # the audience of, in version order, with seq values 1..k and no gap.
        audiences = {
            1: ("alice", "bob"),
            2: ("alice",),
            3: ("bob", "dave"),
            4: ("alice", "bob", "dave"),
            5: ("dave",),
            6: ("alice", "bob", "dave"),
        }
        for file_id, rename_at in (("f-chain", None), ("f-chain-mixed", 4)):
            evs = [
                event(
                    file_id,
                    v,
                    audience=(*users, "carol"),
                    kind="rename" if v == rename_at else "content",
                )
                for v, users in audiences.items()
            ]
            for ev in reversed(evs):  # v6 first: all but v1 park
                await notify.ingest(ev)
            await notify.settled()
            for ev in evs:  # redelivered: nothing new
                await notify.ingest(ev)
            await notify.settled()
        for user in ("alice", "bob", "dave"):
            got = sorted(await notify.all_notifications(user), key=lambda n: int(n.cursor))
            assert [int(n.cursor) for n in got] == list(range(1, len(got) + 1))
            for file_id in ("f-chain", "f-chain-mixed"):
                versions = [n.version for n in got if n.file_id == file_id]
                assert versions == [v for v, users in audiences.items() if user in users]
        assert await notify.all_notifications("carol") == []  # the actor is never notified
