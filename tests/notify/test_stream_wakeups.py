"""Broker wake-ups (unit, no sockets): they coalesce outside the buffer, queued deliveries
come first, and a wake-up for a seq this process is still committing waits for the
transaction's outcome (published on commit, released as a wake-up on rollback)."""

from __future__ import annotations

from serentak.notify.v1 import notify_pb2

from services.notify.fanout import Written
from services.notify.stream_listener import parse_positions
from services.notify.streams import ANY_SEQ, Broker, Delivery


def written(user: str, seq: int) -> Written:
    return Written({"tenant_id": "acme", "user_id": user, "seq": seq}, merged=False)


async def test_wakeups_coalesce_and_never_overflow_the_buffer():
    broker = Broker(buffer_size=1)
    sub = broker.open("acme", "alice", "d")
    for seq in range(1, 100):
        broker.wake("acme", "alice", seq)
    assert not sub.overflowed and sub.queued() == 0
    assert await sub.next() == 99
    assert sub.wake_seq == 0


async def test_queued_deliveries_come_before_a_wakeup():
    broker = Broker(buffer_size=8)
    sub = broker.open("acme", "alice", "d")
    broker.wake("acme", "alice", 7)
    sub.offer(Delivery(7, object(), 0.0))  # type: ignore[arg-type]
    first = await sub.next()
    assert isinstance(first, Delivery) and first.seq == 7
    assert await sub.next() == 7


async def test_wakeup_for_own_commit_is_held_until_it_is_published(monkeypatch):
    broker = Broker(buffer_size=8)
    sub = broker.open("acme", "alice", "d")
    published: list[int] = []
    monkeypatch.setattr(broker, "publish", lambda ws: published.extend(w.seq for w in ws))
    ended = broker.committing([written("alice", 3)])
    broker.wake("acme", "alice", 3)  # its NOTIFY overtook the publish
    assert sub.wake_seq == 0
    ended(True)
    assert published == [3]
    assert sub.wake_seq == 3  # released after the publish: the delivery is queued first


async def test_wakeup_held_for_a_rolled_back_commit_is_released():
    broker = Broker(buffer_size=8)
    sub = broker.open("acme", "alice", "d")
    ended = broker.committing([written("alice", 5)])
    broker.wake("acme", "alice", 5)  # another replica committed seq 5 after our rollback
    ended(False)
    assert sub.queued() == 0 and sub.wake_seq == 5


async def test_wake_all_reads_every_stream():
    broker = Broker(buffer_size=8)
    subs = [broker.open("acme", u, "d") for u in ("alice", "bob")]
    broker.wake_all()
    assert [s.wake_seq for s in subs] == [ANY_SEQ, ANY_SEQ]


def test_parse_positions_reads_both_payload_forms_and_refuses_anything_else():
    assert parse_positions('[["acme", "alice", 12], ["acme", "bob", 3]]') == [
        ("acme", "alice", 12),
        ("acme", "bob", 3),
    ]
    assert parse_positions('["acme", "alice", 12]') == [("acme", "alice", 12)]  # notify_0003
    for bad in (
        "not json",
        "[]",
        '["acme", 1, 12]',
        '["acme", "alice"]',
        '[["acme", "alice", 12], ["acme", "bob"]]',
        '[["acme", "alice", true]]',
        '{"acme": 1}',
    ):
        assert parse_positions(bad) is None, bad


async def test_wakeup_for_a_seq_published_here_is_dropped():
    # This replica's own NOTIFY arrives after its publish: the streams hold the delivery,
    # so no wake-up (no database read); a higher seq (another replica's) still wakes, and
    # a user whose streams all closed starts afresh.
    broker = Broker(buffer_size=8)
    sub = broker.open("acme", "alice", "d")
    own = written("alice", 3)
    own._message = notify_pb2.Notification(cursor="3")  # what the stream would send
    broker.committing([own])(True)
    delivered = await sub.next()
    assert isinstance(delivered, Delivery) and delivered.seq == 3
    broker.wake("acme", "alice", 3)
    assert sub.wake_seq == 0 and sub.queued() == 0
    broker.wake("acme", "alice", 4)
    assert sub.wake_seq == 4
    broker.close(sub)
    again = broker.open("acme", "alice", "d")
    broker.wake("acme", "alice", 3)
    assert again.wake_seq == 3
