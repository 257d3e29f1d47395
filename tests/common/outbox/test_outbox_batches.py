"""The relay's batches: a round's pending events, of many aggregates, in one call per
subscriber, in order per aggregate, each exactly once; any failure of a batch falls back
to one by one."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from collections.abc import Sequence

import pytest
import structlog
from serentak.events.v1 import events_pb2
from sqlalchemy import func, select, update

from services.common.group_commit import GroupCommits
from services.common.outbox import Relay, leases, record_event
from services.common.outbox.models import outbox_events, relay_leases


def _event(aggregate_id: str, version: int) -> events_pb2.Event:
    return events_pb2.Event(
        event_id=uuid.uuid4().hex,
        correlation_id=f"cid-{aggregate_id}-{version}",
        event_type="file.renamed",
        aggregate_type="file",
        aggregate_id=aggregate_id,
        version=version,
        file_renamed=events_pb2.FileRenamed(file_id=aggregate_id, new_name=f"v{version}"),
    )


class BatchingSubscriber:
    """Takes batches; fails the test if an aggregate is published by two relays at once.
    `refuse_batches`: answers False (a subscriber that cannot take them);
    `fail_first_batch`: raises on its first batch."""

    def __init__(self, *, refuse_batches: bool = False, fail_first_batch: bool = False) -> None:
        self.refuse_batches = refuse_batches
        self.fail_next_batch = fail_first_batch
        self.in_flight: set[str] = set()
        self.versions: dict[str, list[int]] = defaultdict(list)
        self.overlaps = 0
        self.batches = 0
        self.singles = 0

    async def _record(self, events: Sequence[events_pb2.Event]) -> None:
        # A round's batch carries events of several aggregates.
        aggregates = {e.aggregate_id for e in events}
        if aggregates & self.in_flight:
            self.overlaps += 1
        self.in_flight |= aggregates
        await asyncio.sleep(0)  # let the other relays run in the middle of a publish
        for event in events:
            self.versions[event.aggregate_id].append(event.version)
        self.in_flight -= aggregates

    async def publish(self, event: events_pb2.Event) -> None:
        self.singles += 1
        await self._record([event])

    async def publish_many(self, events: Sequence[events_pb2.Event]) -> bool:
        if self.refuse_batches:
            return False
        if self.fail_next_batch:
            self.fail_next_batch = False
            raise ConnectionError("subscriber down")
        self.batches += 1
        await self._record(events)
        return True


async def _record_versions(db, aggregates: int, versions: range) -> None:  # type: ignore[no-untyped-def]
    async with db.sessions() as session, session.begin():
        for version in versions:
            for a in range(aggregates):
                await record_event(session, _event(f"f{a}", version))


async def _unpublished(db) -> int:  # type: ignore[no-untyped-def]
    async with db.sessions() as session, session.begin():
        rows = await session.execute(
            select(func.count()).where(outbox_events.c.published_at.is_(None))
        )
        return rows.scalar_one()


async def test_competing_relays_publish_batches_in_order_exactly_once(runtime_db) -> None:  # type: ignore[no-untyped-def]
    aggregates = 8
    subscriber = BatchingSubscriber()
    relays = [
        Relay(runtime_db.sessions, [subscriber], relay_id=f"r{i}", concurrency=4, batch_size=5)
        for i in range(3)
    ]
    for start in (1, 7, 13):
        await _record_versions(runtime_db, aggregates, range(start, start + 6))
        await asyncio.gather(*(r.publish_pending() for r in relays))
    while sum(await asyncio.gather(*(r.publish_pending() for r in relays))):
        pass
    assert subscriber.overlaps == 0
    assert len(subscriber.versions) == aggregates
    for published in subscriber.versions.values():
        assert published == list(range(1, 19))  # in order, each exactly once
    # Batches, not one call per event.
    assert subscriber.batches + subscriber.singles <= aggregates * 18 // 2
    assert await _unpublished(runtime_db) == 0


async def test_a_failed_batch_is_published_one_by_one_in_order(runtime_db) -> None:  # type: ignore[no-untyped-def]
    await _record_versions(runtime_db, 1, range(1, 5))
    subscriber = BatchingSubscriber(fail_first_batch=True)
    relay = Relay(runtime_db.sessions, [subscriber], relay_id="r")
    assert await relay.publish_pending() == 4
    assert subscriber.versions == {"f0": [1, 2, 3, 4]}
    assert (subscriber.batches, subscriber.singles) == (0, 4)
    await _record_versions(runtime_db, 1, range(5, 8))
    assert await relay.publish_pending() == 3  # the next batch goes as a batch again
    assert subscriber.versions == {"f0": list(range(1, 8))}
    assert subscriber.batches == 1
    assert await _unpublished(runtime_db) == 0


async def test_a_subscriber_refusing_batches_gets_one_event_per_call(runtime_db) -> None:  # type: ignore[no-untyped-def]
    await _record_versions(runtime_db, 2, range(1, 4))
    subscriber = BatchingSubscriber(refuse_batches=True)
    relay = Relay(runtime_db.sessions, [subscriber], relay_id="r")
    assert await relay.publish_pending() == 6
    assert subscriber.versions == {"f0": [1, 2, 3], "f1": [1, 2, 3]}
    assert (subscriber.batches, subscriber.singles) == (0, 6)
    assert await _unpublished(runtime_db) == 0


async def test_each_event_of_a_batch_is_logged_under_its_own_correlation_id(runtime_db) -> None:  # type: ignore[no-untyped-def]
    await _record_versions(runtime_db, 1, range(1, 5))
    subscriber = BatchingSubscriber()
    relay = Relay(runtime_db.sessions, [subscriber], relay_id="r")
    with structlog.testing.capture_logs(
        processors=[structlog.contextvars.merge_contextvars]
    ) as logs:
        assert await relay.publish_pending() == 4
    assert subscriber.batches == 1
    published = [e for e in logs if e["event"] == "outbox_event_published"]
    assert [(e["correlation_id"], e["version"], e["batch"]) for e in published] == [
        (f"cid-f0-{v}", v, 4) for v in range(1, 5)
    ]


async def test_a_round_sends_many_aggregates_events_in_one_batch(runtime_db) -> None:  # type: ignore[no-untyped-def]
    await _record_versions(runtime_db, 12, range(1, 3))
    # One aggregate's lease is held by another relay: the round leaves it alone.
    async with runtime_db.sessions() as session, session.begin():
        other = await leases.acquire(session, "file:f3", "other-relay", 60)
    subscriber = BatchingSubscriber()
    relay = Relay(runtime_db.sessions, [subscriber], relay_id="r")
    assert await relay.publish_pending() == 22
    assert subscriber.batches == 1 and subscriber.singles == 0
    assert "f3" not in subscriber.versions
    assert all(subscriber.versions[f"f{a}"] == [1, 2] for a in range(12) if a != 3)
    # The round gave its leases up; f3's is still the other relay's.
    async with runtime_db.sessions() as session, session.begin():
        keys = (await session.execute(select(relay_leases.c.aggregate_key))).scalars().all()
        assert keys == ["file:f3"]
        await leases.release(session, "file:f3", other)  # type: ignore[arg-type]
    assert await relay.publish_pending() == 2
    assert subscriber.versions["f3"] == [1, 2]
    assert await _unpublished(runtime_db) == 0


class StealingSubscriber(BatchingSubscriber):
    """Takes one aggregate's lease over while the round's batch is in flight (as a relay
    would after this one's lease had ended)."""

    def __init__(self, db, key: str) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.db, self.key = db, key

    async def publish_many(self, events: Sequence[events_pb2.Event]) -> bool:
        async with self.db.sessions() as session, session.begin():
            await session.execute(
                update(relay_leases)
                .where(relay_leases.c.aggregate_key == self.key)
                .values(holder="thief", lease_token="stolen")
            )
        return await super().publish_many(events)


async def test_a_round_marks_no_event_whose_lease_it_lost(runtime_db) -> None:  # type: ignore[no-untyped-def]
    await _record_versions(runtime_db, 3, range(1, 2))
    relay = Relay(runtime_db.sessions, [StealingSubscriber(runtime_db, "file:f1")], relay_id="r")
    assert await relay.publish_pending() == 2
    # f1's event stays unpublished for the lease's new holder (subscribers deduplicate).
    async with runtime_db.sessions() as session, session.begin():
        unpublished = (
            await session.execute(
                select(outbox_events.c.aggregate_id).where(outbox_events.c.published_at.is_(None))
            )
        ).scalars()
        assert list(unpublished) == ["f1"]
        holders = (await session.execute(select(relay_leases.c.holder))).scalars().all()
        assert holders == ["thief"]


async def test_relays_writing_through_group_commits_publish_in_order_exactly_once(
    runtime_db,
) -> None:  # type: ignore[no-untyped-def]
    """Two relays whose lease and mark transactions are units of their group committer,
    racing writers that record events through the same committers (SQLite, where the
    service wires them so: `outbox.relay`, "Write transactions")."""
    if runtime_db.engine.dialect.name != "sqlite":
        pytest.skip("on PostgreSQL the relay keeps transactions of its own")
    subscriber = BatchingSubscriber()
    sizes: list[int] = []
    groups = [GroupCommits(runtime_db.sessions, on_group=sizes.append) for _ in range(2)]
    relay_units = [0]

    def through(group: GroupCommits):  # type: ignore[no-untyped-def]
        async def writes(work):  # type: ignore[no-untyped-def]
            relay_units[0] += 1
            return await group.run(work)

        return writes

    relays = [
        Relay(runtime_db.sessions, [subscriber], relay_id=f"r{i}", batch_size=5, writes=through(g))
        for i, g in enumerate(groups)
    ]

    async def writer(group: GroupCommits, name: str) -> None:
        for version in range(1, 13):
            event = _event(name, version)
            await group.run(lambda session, event=event: record_event(session, event))
            await asyncio.gather(*(r.publish_pending() for r in relays))

    await asyncio.gather(*(writer(groups[i % 2], f"w{i}") for i in range(4)))
    while sum(await asyncio.gather(*(r.publish_pending() for r in relays))):
        pass
    for group in groups:
        await group.close()
    assert subscriber.overlaps == 0
    assert subscriber.versions == {f"w{i}": list(range(1, 13)) for i in range(4)}
    assert await _unpublished(runtime_db) == 0
    # Every unit committed through the groups: the writers' 48 and the relays' own.
    assert sum(sizes) == 48 + relay_units[0]


async def test_leases_of_any_count_are_taken_renewed_and_released_in_full(runtime_db) -> None:  # type: ignore[no-untyped-def]
    """Counts that are no power of two: taken in chunks, renewed and released with padded
    lists; every one of them, and nothing else (a release tells which were ours)."""
    for count in (1, 3, 37):
        keys = [f"file:c{count}-{i:02d}" for i in range(count)]
        async with runtime_db.sessions.begin() as session:
            held = await leases.acquire_many(session, keys, "r", 30)
        assert sorted(held) == keys
        async with runtime_db.sessions.begin() as session:
            assert await leases.acquire_many(session, keys, "other", 30) == {}
            assert await leases.renew_many(session, held, 30) == set(keys)
            assert await leases.release_many(session, held) == set(keys)
            # Given up: releasing them again finds none of them ours.
            assert await leases.release_many(session, held) == set()
        async with runtime_db.sessions() as session:
            left = await session.scalar(select(func.count()).select_from(relay_leases))
        assert left == 0
