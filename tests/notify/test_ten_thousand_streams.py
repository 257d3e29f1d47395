"""Notify keeps its delivery guarantees at 10,000 live streams on one replica (issue 37).

One client opens 10,000 Subscribe streams at once (2,000 users x 5 devices) on a notify
process of its own (PostgreSQL): every stream starts, its first message the "now" cursor
(grpc used to refuse calls past the 1,000 it had not handed over yet: ~10% of 2,000
streams opened together ended CANCELLED). Then three producers race IngestBatch calls
carrying every version of three files with overlapping audiences, each in its own
shuffled order: duplicates and out-of-order versions arrive together (notify parks early
versions and applies them in order; one audience is larger than an inline fan-out, so
fan-out jobs run too). Every stream gets each version of each of its user's files exactly
once, per file in version order, at increasing cursors, the same sequence on all five
devices, and nothing about other files or its user's own changes; the database holds
one notification per audience user, file and version; badges count them. No producer
call fails or times out: every stream message spends its tenant's rate-limit key, and
waking every stream waiting on that key at each reservation starved the replica's loop
until IngestBatch calls waited in grpc past 30 s and were CANCELLED (limiter.py)."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from notify.harness import SERVICE, event, user_md
from serentak.events.v1 import events_pb2
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from serentak.sdk import notifications_in
from sqlalchemy.engine import make_url
from support.postgres import PostgresDatabases
from support.services import service_process

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

USERS = 2_000
DEVICES = 5
STREAMS = USERS * DEVICES
# Stream n is device n % DEVICES of user n // DEVICES; its max_batch (0: one a message).
MAX_BATCH = (0, 1, 4, 16, 64)
VERSIONS = 4
PRODUCERS = 3
OFFLINE = 1_100  # f-wide's audience users without a stream: 2,099 > inline_fanout_max
OPEN_DEADLINE_S = 120.0
DELIVERY_DEADLINE_S = 120.0
# The upload outbox relay's IngestBatch deadline (services/common/outbox/subscribers.py).
INGEST_TIMEOUT_S = 10.0
BADGE_SAMPLE = 50


def _user(n: int) -> str:
    return f"u{n}"


# file -> (actor, audience). The actors of f-all and f-wide have streams and are told
# nothing about their own change.
FILES: dict[str, tuple[str, list[str]]] = {
    "f-all": (_user(0), [_user(n) for n in range(USERS)]),
    "f-even": ("carol", [_user(n) for n in range(0, USERS, 2)]),
    "f-wide": (
        _user(1_001),
        [_user(n) for n in range(USERS // 2, USERS)] + [f"x{n}" for n in range(OFFLINE)],
    ),
}
# Told to everyone once every stream has the files' last versions: each stream reads up
# to it, so a notification delivered twice before it is seen.
FENCE = "f-fence"


def _files_of(user: str) -> list[str]:
    """The files `user` is told about (in the audience, not the actor), fence aside."""
    return sorted(f for f, (actor, audience) in FILES.items() if user in audience and user != actor)


def _events() -> list[events_pb2.Event]:
    """Every version of every file, built once: every producer sends these same events."""
    return [
        event(f, v, actor=actor, audience=audience, event_id=f"{f}-v{v}")
        for f, (actor, audience) in FILES.items()
        for v in range(1, VERSIONS + 1)
    ]


async def _produce(
    stub: notify_pb2_grpc.NotifyServiceStub, events: list[events_pb2.Event], seed: int
) -> list[tuple[str, int]]:
    """Send `events` in a shuffled order, one to three per IngestBatch call, one call at a
    time, with the relay's deadline; (event_id, outcome) of each."""
    rng = random.Random(seed)
    order = rng.sample(events, len(events))
    outcomes: list[tuple[str, int]] = []
    while order:
        size = rng.randint(1, 3)
        chunk, order = order[:size], order[size:]
        resp = await stub.IngestBatch(
            notify_pb2.IngestBatchRequest(events=chunk), metadata=SERVICE, timeout=INGEST_TIMEOUT_S
        )
        outcomes.extend((ev.event_id, r.outcome) for ev, r in zip(chunk, resp.results, strict=True))
    return outcomes


class CaughtUp:
    """Counts down the streams still missing a last version; set when none is."""

    def __init__(self, streams: int) -> None:
        self.left = streams
        self.all = asyncio.Event()

    def one(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.all.set()


async def _follow(
    call: grpc.aio.UnaryStreamCall, files: list[str], caught: CaughtUp, label: str
) -> list[notify_pb2.Notification]:
    """Read a started stream until it has the last version of each of `files` (then count
    it caught up) and the fence: everything it was sent up to the fence."""
    got: list[notify_pb2.Notification] = []
    waiting = set(files)
    if not waiting:
        caught.one()
    while not got or got[-1].file_id != FENCE:
        item = await call.read()
        assert item is not grpc.aio.EOF, f"{label}: stream ended after {len(got)}"
        batch = notifications_in(item)
        assert batch and item.cursor == batch[-1].cursor, f"{label}: {item}"
        got.extend(batch)
        if waiting:
            waiting.difference_update(n.file_id for n in batch if n.version == VERSIONS)
            if not waiting:
                caught.one()
    return got


def _check_stream(got: list[notify_pb2.Notification], user: str, start: str) -> None:
    """One stream's notifications after its first cursor `start`: each version of its
    user's files once, per file in version order, at increasing cursors, then the fence."""
    cursors = [int(start)] + [int(n.cursor) for n in got]
    assert all(a < b for a, b in itertools.pairwise(cursors)), f"{user}: cursors out of order"
    assert [n.file_id for n in got].count(FENCE) == 1, f"{user}: the fence twice"
    seen: dict[str, list[int]] = {}
    for n in got[:-1]:
        assert n.user_id == user and n.digest_count == 1, n
        seen.setdefault(n.file_id, []).append(n.version)
    assert seen == {f: list(range(1, VERSIONS + 1)) for f in _files_of(user)}, user


def _expected_rows() -> Counter[tuple[str, str, int]]:
    """(user, file, version) of every notification there should be, once each."""
    rows: Counter[tuple[str, str, int]] = Counter()
    for f, (actor, audience) in FILES.items():
        rows.update((u, f, v) for u in audience if u != actor for v in range(1, VERSIONS + 1))
    rows.update((_user(n), FENCE, 1) for n in range(USERS))
    return rows


async def _stored_rows(url: str) -> Counter[tuple[str, str, int]]:
    """(user, file, version) of every notification in the database."""
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT user_id, file_id, version FROM notifications")
        return Counter((u, f, int(v)) for u, f, v in await cur.fetchall())


async def test_10000_streams_get_every_version_once_in_order_while_producers_race(
    postgres: PostgresDatabases, tmp_path: Path
) -> None:
    url = postgres.create()
    tokens = {f"tok-{_user(n)}": {"tenant_id": "acme", "user_id": _user(n)} for n in range(USERS)}
    env = {
        "SERENTAK_NOTIFY_DATABASE_URL": url,
        "SERENTAK_AUTH_TOKENS": json.dumps(tokens),
        "SERENTAK_STREAMS_MAX": str(STREAMS),
        "SERENTAK_STREAMS_PER_TENANT_MAX": str(STREAMS),
        "SERENTAK_LOG_LEVEL": "WARNING",
    }
    events = _events()
    with service_process("notify", tmp_path, env) as svc:
        async with grpc.aio.insecure_channel(svc.address) as channel:
            stub = notify_pb2_grpc.NotifyServiceStub(channel)
            calls = [
                stub.Subscribe(
                    notify_pb2.SubscribeRequest(
                        device_id=f"d{n % DEVICES}", max_batch=MAX_BATCH[n % DEVICES]
                    ),
                    metadata=user_md(_user(n // DEVICES)),
                )
                for n in range(STREAMS)
            ]
            tasks: list[asyncio.Task[Any]] = []
            try:
                # Opened at once: every stream starts, its first message the "now" cursor.
                async with asyncio.timeout(OPEN_DEADLINE_S):
                    firsts = await asyncio.gather(
                        *(c.read() for c in calls), return_exceptions=True
                    )
                failed = [f for f in firsts if not isinstance(f, notify_pb2.SubscribeResponse)]
                assert failed == [], f"{len(failed)} streams never started: {failed[:3]}"
                starts = [f.cursor for f in firsts if isinstance(f, notify_pb2.SubscribeResponse)]
                assert all(
                    f.cursor and not f.HasField("notification") and not f.notifications
                    for f in firsts
                    if isinstance(f, notify_pb2.SubscribeResponse)
                )

                caught = CaughtUp(STREAMS)
                readers = [
                    asyncio.create_task(
                        _follow(call, _files_of(_user(n // DEVICES)), caught, f"stream {n}")
                    )
                    for n, call in enumerate(calls)
                ]
                all_caught = asyncio.create_task(caught.all.wait())
                tasks = [*readers, all_caught]
                async with asyncio.timeout(DELIVERY_DEADLINE_S):
                    try:
                        produced = await asyncio.gather(
                            *(_produce(stub, events, seed) for seed in range(PRODUCERS))
                        )
                    except grpc.aio.AioRpcError as err:
                        pytest.fail(f"a producer's IngestBatch failed: {err.code()} {err}")
                    # Until every stream has the last versions (a stream that fails ends).
                    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                    for task in done - {all_caught}:
                        task.result()
                        pytest.fail("a stream got the fence before the files' last versions")
                    fence = event(
                        FENCE, 1, actor="carol", audience=[_user(n) for n in range(USERS)]
                    )
                    await stub.IngestBatch(
                        notify_pb2.IngestBatchRequest(events=[fence]),
                        metadata=SERVICE,
                        timeout=INGEST_TIMEOUT_S,
                    )
                    streams = await asyncio.gather(*readers)

                # Badges: a sample of users, and those told the least and the most.
                sample = [*random.Random(7).sample(range(USERS), BADGE_SAMPLE), 0, 1_000, 1_001]
                badges = await asyncio.gather(
                    *(
                        stub.GetUnreadCount(
                            notify_pb2.GetUnreadCountRequest(), metadata=user_md(_user(n))
                        )
                        for n in sample
                    )
                )
            finally:
                for call in calls:
                    call.cancel()
                for task in tasks:
                    task.cancel()

    # Each event was news to exactly one producer's call (applied, or parked until its
    # predecessors came), a duplicate to the others; none was skipped as old.
    outcomes = [o for result in produced for o in result]
    assert len(outcomes) == PRODUCERS * len(events)
    news = Counter(e for e, o in outcomes if o != notify_pb2.INGEST_OUTCOME_DUPLICATE)
    assert news == Counter(ev.event_id for ev in events)
    assert {o for _, o in outcomes} <= {
        notify_pb2.INGEST_OUTCOME_APPLIED,
        notify_pb2.INGEST_OUTCOME_PARKED,
        notify_pb2.INGEST_OUTCOME_DUPLICATE,
    }
    for n, got in enumerate(streams):
        _check_stream(got, _user(n // DEVICES), starts[n])
    for u in range(USERS):
        # A user has one stream of notifications: every device was sent the same sequence.
        sequences = {
            tuple((m.cursor, m.notification_id) for m in streams[u * DEVICES + d])
            for d in range(DEVICES)
        }
        assert len(sequences) == 1, f"{_user(u)}'s devices were sent different sequences"
    for n, badge in zip(sample, badges, strict=True):
        assert badge.unread_count == VERSIONS * len(_files_of(_user(n))) + 1, _user(n)
    assert await _stored_rows(url) == _expected_rows()
