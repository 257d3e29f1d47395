"""The relay's rounds (Relay.run): a round sees what was committed before it began, so a
commit during a round, or the events a round left past its batch size, are published with
no poll; a round that published all it saw waits for the next wake, and then for
`gather_seconds` more, so commits close together go in one round."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Sequence

from serentak.events.v1 import events_pb2

from services.common.outbox import Relay, record_event

# Longer than any test: an event published only after a poll fails the test (timeout).
NO_POLL_SECONDS = 3600.0


def _event(aggregate_id: str) -> events_pb2.Event:
    return events_pb2.Event(
        event_id=uuid.uuid4().hex,
        event_type="file.renamed",
        aggregate_type="file",
        aggregate_id=aggregate_id,
        version=1,
        file_renamed=events_pb2.FileRenamed(file_id=aggregate_id, new_name="v1"),
    )


async def _record(db, *aggregate_ids: str) -> None:  # type: ignore[no-untyped-def]
    async with db.sessions() as session, session.begin():
        for aggregate_id in aggregate_ids:
            await record_event(session, _event(aggregate_id))


class Counting:
    """Takes events one by one or in batches; `reached(n)` once it has `n` of them."""

    def __init__(self, during_first=None) -> None:  # type: ignore[no-untyped-def]
        self.seen: list[str] = []
        self.calls: list[list[str]] = []
        self._during_first = during_first
        self._waits: list[tuple[int, asyncio.Event]] = []

    async def publish(self, event: events_pb2.Event) -> None:
        await self.publish_many([event])

    async def publish_many(self, events: Sequence[events_pb2.Event]) -> bool:
        if self._during_first is not None:
            during, self._during_first = self._during_first, None
            await during()
        self.seen.extend(e.aggregate_id for e in events)
        self.calls.append([e.aggregate_id for e in events])
        for count, reached in self._waits:
            if len(self.seen) >= count:
                reached.set()
        return True

    async def reached(self, count: int) -> None:
        reached = asyncio.Event()
        self._waits.append((count, reached))
        if len(self.seen) >= count:
            reached.set()
        async with asyncio.timeout(60):
            await reached.wait()


@contextlib.asynccontextmanager
async def running(relay: Relay):  # type: ignore[no-untyped-def]
    task = asyncio.create_task(relay.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_events_past_a_rounds_batch_size_go_in_the_next_round_without_a_wake(
    runtime_db,
) -> None:  # type: ignore[no-untyped-def]
    await _record(runtime_db, *(f"a{i}" for i in range(12)))
    subscriber = Counting()
    relay = Relay(
        runtime_db.sessions, [subscriber], relay_id="r", batch_size=5, poll_interval=NO_POLL_SECONDS
    )
    async with running(relay):
        await subscriber.reached(12)  # three rounds (5, 5, 2) after the first, unwoken
    assert sorted(subscriber.seen) == sorted(f"a{i}" for i in range(12))


async def test_a_commit_during_a_round_is_published_by_the_next_without_a_poll(
    runtime_db,
) -> None:  # type: ignore[no-untyped-def]
    relay: Relay

    async def commit_and_wake() -> None:
        # As a service does: commit an event, then wake the relay.
        await _record(runtime_db, "later")
        relay.wake()

    await _record(runtime_db, "first")
    subscriber = Counting(during_first=commit_and_wake)
    relay = Relay(runtime_db.sessions, [subscriber], relay_id="r", poll_interval=NO_POLL_SECONDS)
    async with running(relay):
        await subscriber.reached(2)
    assert subscriber.seen == ["first", "later"]


async def test_a_relay_asleep_after_a_round_publishes_what_a_wake_announces(
    runtime_db,
) -> None:  # type: ignore[no-untyped-def]
    await _record(runtime_db, "first")
    subscriber = Counting()
    relay = Relay(runtime_db.sessions, [subscriber], relay_id="r", poll_interval=NO_POLL_SECONDS)
    async with running(relay):
        await subscriber.reached(1)
        await _record(runtime_db, "second")
        relay.wake()
        await subscriber.reached(2)
    assert subscriber.seen == ["first", "second"]


async def test_commits_inside_the_gather_window_go_in_one_round(runtime_db) -> None:  # type: ignore[no-untyped-def]
    await _record(runtime_db, "first")
    subscriber = Counting()
    # The window is far longer than two commits take here.
    relay = Relay(
        runtime_db.sessions,
        [subscriber],
        relay_id="r",
        poll_interval=NO_POLL_SECONDS,
        gather_seconds=2.0,
    )
    async with running(relay):
        await subscriber.reached(1)
        for name in ("second", "third"):
            await _record(runtime_db, name)
            relay.wake()
        await subscriber.reached(3)
    assert subscriber.calls == [["first"], ["second", "third"]]
