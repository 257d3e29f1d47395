"""Inline fan-out: Ingest writes a small audience's notifications in its own transaction
(PostgreSQL and SQLite); big audiences go to a fan-out job. Both paths racing on the same files
keep per-file version order, gapless per-user streams and exactly one notification per
(user, file, version); a transaction that fails after writing leaves and publishes nothing."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest
from notify.harness import SERVICE, event, user_md
from serentak.notify.v1 import notify_pb2
from sqlalchemy import text

from services.notify import metrics
from services.notify.fanout_job import FanOutHandler

DEADLINE_S = 30.0
SMALL = ("alice", "bob", "carol")  # carol acts: 2 users, inline with inline_fanout_max=2
BIG = ("abe", "alice", "bob", "carol")  # 3 users: a fan-out job


def _inline_events() -> float:
    return metrics.FANOUT_INLINE_EVENTS._value.get()


def _all_events() -> float:
    return metrics.FANOUT_EVENTS._value.get()


async def _live(notify, user: str, want: int) -> asyncio.Task[list[notify_pb2.Notification]]:
    """A stream opened now (registered: its position marker is read before this returns)
    and a task collecting its first `want` notifications."""
    call = notify.stub.Subscribe(notify_pb2.SubscribeRequest(device_id="t"), metadata=user_md(user))
    async with asyncio.timeout(DEADLINE_S):
        marker = await call.read()
    assert not marker.HasField("notification") and int(marker.cursor) == 0

    async def collect() -> list[notify_pb2.Notification]:
        got: list[notify_pb2.Notification] = []
        async with asyncio.timeout(DEADLINE_S):
            while len(got) < want:
                got.append((await call.read()).notification)
        call.cancel()
        return got

    return asyncio.create_task(collect())


async def test_inline_and_job_fan_outs_race_in_order_and_exactly_once(notify_factory, database_url):
    rng = random.Random(7)
    async with notify_factory(extra_users=["abe"], inline_fanout_max=2) as notify:
        audiences = {
            (f, v): (BIG if rng.random() < 0.4 else SMALL) for f in range(25) for v in range(1, 7)
        }
        events = [event(f"f-mix-{f}", v, audience=users) for (f, v), users in audiences.items()]
        expected = {
            u: sorted(k for k, users in audiences.items() if u in users and u != "carol")
            for u in ("abe", "alice", "bob")
        }
        # Live streams are open while both paths race: each must see its user's
        # notifications once, in seq order, without a gap.
        readers = {u: await _live(notify, u, len(expected[u])) for u in ("abe", "alice")}
        inline0, all0 = _inline_events(), _all_events()
        ordered = list(events)  # per file in version order, files interleaved
        ordered.sort(key=lambda ev: (ev.version, rng.random()))
        shuffled = list(events)
        rng.shuffle(shuffled)  # redeliveries, out of order: park, fill gaps, duplicates
        await asyncio.gather(
            notify.ingest_all(ordered, parallel=16), notify.ingest_all(shuffled, parallel=8)
        )
        await notify.settled()
        inline = _inline_events() - inline0
        total = _all_events() - all0
        assert total == len(events)  # every event written exactly once, by one path
        assert 0 < inline < len(events), "both paths must have raced"
        for user, want in expected.items():
            got = sorted(await notify.all_notifications(user), key=lambda n: int(n.cursor))
            assert [int(n.cursor) for n in got] == list(range(1, len(got) + 1))
            assert sorted((int(n.file_id.rsplit("-", 1)[1]), n.version) for n in got) == want
            last: dict[str, int] = {}
            for n in got:  # per file, versions in order within the user's stream
                assert n.version > last.get(n.file_id, 0)
                last[n.file_id] = n.version
        for user, task in readers.items():
            live = await task
            assert [int(n.cursor) for n in live] == list(range(1, len(expected[user]) + 1))
            assert len({n.notification_id for n in live}) == len(live)
            # Live items (an event's shared fields encoded once, copied per recipient)
            # say exactly what the stored notifications say.
            stored = {n.notification_id: n for n in await notify.all_notifications(user)}
            assert all(n == stored[n.notification_id] for n in live)


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_an_event_behind_a_pending_job_waits_for_it(notify_factory, database_url):
    async with notify_factory(extra_users=["abe"], inline_fanout_max=2) as notify:
        v1 = event("f-behind", 1, audience=BIG)  # a job
        v2 = event("f-behind", 2, audience=SMALL)  # inline-sized, but v1 is not written yet
        async with notify.parts.engine.connect() as blocker:
            # An uncommitted stream row for abe (sorted first of v1's users): v1's job
            # blocks on it before locking anyone else, unwritten until the rollback.
            await blocker.execute(
                text(
                    "INSERT INTO notify_user_streams (tenant_id, user_id, last_seq) "
                    "VALUES ('acme', 'abe', 0)"
                )
            )
            await notify.ingest(v1)
            inline0 = _inline_events()
            resp = await notify.ingest(v2)
            assert resp.outcome == notify_pb2.INGEST_OUTCOME_APPLIED
            assert _inline_events() == inline0, "v2 went inline ahead of v1's job"
            assert await notify.all_notifications("alice") == []
            await blocker.rollback()
        await notify.settled()
        got = sorted(await notify.all_notifications("alice"), key=lambda n: int(n.cursor))
        assert [(n.version, int(n.cursor)) for n in got] == [(1, 1), (2, 2)]
        # Once the file's backlog is written, its next small event goes inline again.
        await notify.ingest(event("f-behind", 3, audience=SMALL))
        assert _inline_events() == inline0 + 1
        got = await notify.all_notifications("bob")
        assert sorted(n.version for n in got) == [1, 2, 3]


async def test_an_event_behind_a_queued_job_waits_for_it(notify_factory, monkeypatch):
    # Either backend: v1's fan-out job is held before it starts, so v1 waits `applied`;
    # v2 fits the inline budget but must not overtake it.
    gate = asyncio.Event()
    original = FanOutHandler.__call__

    async def held(self, ctx):  # type: ignore[no-untyped-def]
        await gate.wait()
        return await original(self, ctx)

    monkeypatch.setattr(FanOutHandler, "__call__", held)
    async with notify_factory(extra_users=["abe"], inline_fanout_max=2) as notify:
        await notify.ingest(event("f-queued", 1, audience=BIG))  # a job
        inline0 = _inline_events()
        resp = await notify.ingest(event("f-queued", 2, audience=SMALL))
        assert resp.outcome == notify_pb2.INGEST_OUTCOME_APPLIED
        assert _inline_events() == inline0, "v2 went inline ahead of v1's job"
        assert await notify.all_notifications("alice") == []
        gate.set()
        await notify.settled()
        got = sorted(await notify.all_notifications("alice"), key=lambda n: int(n.cursor))
        assert [(n.version, int(n.cursor)) for n in got] == [(1, 1), (2, 2)]
        # With the backlog written, the file's next small event goes inline again.
        await notify.ingest(event("f-queued", 3, audience=SMALL))
        assert _inline_events() == inline0 + 1


async def test_a_failed_inline_transaction_writes_and_publishes_nothing(
    notify_factory, database_url, monkeypatch
):
    async with notify_factory() as notify:
        writer = notify.parts.inbox._writer
        original = writer.write
        failures = []

        async def write_then_fail(session, chain, *args):
            written = await original(session, chain, *args)
            if not failures:
                failures.append(chain[0].event_id)
                raise RuntimeError("crash after the notifications were written")
            return written

        monkeypatch.setattr(writer, "write", write_then_fail)
        ev = event("f-crash", 1)
        stream = await _live(notify, "alice", 1)
        # Inline: Ingest's transaction fails after writing; the relay redelivers.
        with pytest.raises(grpc.aio.AioRpcError):
            await notify.ingest(ev)
        assert failures == [ev.event_id]
        assert await notify.all_notifications("alice") == []
        await notify.settled()
        assert await notify.all_notifications("alice") == []
        resp = await notify.ingest(ev)
        assert resp.outcome == notify_pb2.INGEST_OUTCOME_APPLIED
        await notify.settled()
        assert failures == [ev.event_id]
        (live,) = await stream
        assert (live.version, int(live.cursor)) == (1, 1)
        got = await notify.all_notifications("alice")
        assert [(n.notification_id, n.version) for n in got] == [(live.notification_id, 1)]
        assert len(await notify.all_notifications("bob")) == 1


async def test_a_chain_over_the_budget_goes_inline_up_to_it_and_the_rest_by_one_job(
    notify_factory, database_url
):
    # 2 users an event, at most 5 notifications inline: of one batch of 6 versions, 2
    # are written by Ingest itself and the other 4 by the job it queues, behind them;
    # a second batch racing it for the next versions waits for that job (`behind`).
    async with notify_factory(inline_fanout_max=5) as notify:
        first = [event("f-over", v, audience=SMALL) for v in range(1, 7)]
        second = [event("f-over", v, audience=SMALL) for v in range(7, 10)]
        stream = await _live(notify, "alice", 9)
        inline0, all0 = _inline_events(), _all_events()
        resp = await notify.stub.IngestBatch(
            notify_pb2.IngestBatchRequest(events=first), metadata=SERVICE
        )
        assert [r.outcome for r in resp.results] == [notify_pb2.INGEST_OUTCOME_APPLIED] * 6
        assert _inline_events() - inline0 == 2
        await asyncio.gather(
            notify.stub.IngestBatch(notify_pb2.IngestBatchRequest(events=second), metadata=SERVICE),
            notify.stub.IngestBatch(notify_pb2.IngestBatchRequest(events=first), metadata=SERVICE),
        )
        await notify.settled()
        assert _all_events() - all0 == 9  # every version written once, by one path
        live = await stream
        assert [(n.version, int(n.cursor)) for n in live] == [(v, v) for v in range(1, 10)]
        for user in ("alice", "bob"):
            got = sorted(await notify.all_notifications(user), key=lambda n: int(n.cursor))
            assert [(n.version, int(n.cursor)) for n in got] == [(v, v) for v in range(1, 10)]


# The one-statement fan-out is PostgreSQL's (and on SQLite the stream's first read would
# wait for the transaction this test's hook holds open: one connection).
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_stream_opened_while_its_notification_commits_still_gets_it_once(
    notify_factory, database_url, monkeypatch
):
    # The one-statement fan-out returns the rows of users with a stream open in this
    # process only (it hands those to their streams after commit). Bob's stream opens
    # after the statement and before the commit: it reads the position before the
    # commit, and the commit's NOTIFY makes it read the notification. Alice's was open.
    async with notify_factory() as notify:
        writer = notify.parts.inbox._writer
        original = writer.write
        late: list[asyncio.Task[list[notify_pb2.Notification]]] = []
        published: list[tuple[str, int]] = []

        async def write_then_open(session, chain, *args):
            fanned = await original(session, chain, *args)
            published.extend((w.user_id, w.seq) for w in fanned.published)
            late.append(await _live(notify, "bob", 1))
            return fanned

        monkeypatch.setattr(writer, "write", write_then_open)
        alice = await _live(notify, "alice", 1)
        await notify.ingest(event("f-late", 1))
        await notify.settled()
        assert len(late) == 1
        assert published == [("alice", 1)]  # bob was not watching yet
        for stream in (alice, *late):
            (got,) = await stream
            assert (got.file_id, got.version, int(got.cursor)) == ("f-late", 1, 1)
        assert len(await notify.all_notifications("bob")) == 1
