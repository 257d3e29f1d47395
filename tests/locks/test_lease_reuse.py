"""A released lock's lease is reused, and never in a way that touches a later lock.

Against the real etcd: stale Release/Refresh/Hold with an old token, the same key name
re-created on the same lease, releases that deleted nothing, renewed leases, waiters,
stale-recovery counting, two acquires racing for one given-back lease, a release racing
the pool's age-out, and many contenders racing over a few names.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator

import grpc
import pytest
from serentak.locks.v1 import locks_pb2

from services.locks.errors import LockHeld, LockLost
from services.locks.etcd_client import Etcd
from services.locks.etcd_connection import options_from_settings
from services.locks.hold import Holding, Lost, LostReason
from services.locks.keys import KeySpace
from services.locks.lease_pool import LeasePool
from services.locks.lock_views import Caller, LockView
from services.locks.metrics import LEASES_REUSED, STALE_LOCK_RECOVERIES
from services.locks.mutex import Mutex
from services.locks.reaper import LeaseReaper
from services.locks.settings import LocksSettings

pytestmark = pytest.mark.etcd

TTL = 30  # the pool's age limit is then min(max_age, 3 s)
MERGE = Caller("service:upload")  # who takes the locks below (the Mutex's own tests)


@pytest.fixture
async def mutex(etcd) -> AsyncIterator[Mutex]:  # type: ignore[no-untyped-def]
    """A Mutex whose pool reuses leases for up to 3 s after their grant (no timing luck)."""
    client = Etcd(etcd.endpoint, call_timeout=5)
    m = Mutex(
        client,
        KeySpace(f"/t/{uuid.uuid4().hex}/"),
        LeaseReaper(client),
        LeasePool(client, max_age=3.0),
    )
    try:
        yield m
    finally:
        await m.leases.close()
        await client.close()


async def acquire(m: Mutex, name: str, wait_ms: int = 0, ttl: int = TTL) -> LockView:
    return await m.acquire(m.keys.lock_key(name, "acme"), "o", ttl, wait_ms, "cid", caller=MERGE)


def key(m: Mutex, name: str):  # type: ignore[no-untyped-def]
    return m.keys.lock_key(name, "acme")


async def until(check, what: str) -> None:  # type: ignore[no-untyped-def]
    """Poll an observable condition (bounded: 10 s)."""
    for _ in range(2000):
        if await check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never saw {what}")


async def one_waiter(m: Mutex, name: str) -> None:
    async def check() -> bool:
        return len((await m.describe(key(m, name))).waiters) == 1

    await until(check, "one waiter")


def shelved(m: Mutex, lease_id: int) -> bool:
    return any(s.id == lease_id for shelf in m.leases._shelves.values() for s in shelf)


async def test_a_released_lease_is_reused_with_its_grant_time_and_a_newer_token(mutex) -> None:  # type: ignore[no-untyped-def]
    m = mutex
    a = await acquire(m, "file:a")
    assert await m.release(key(m, "file:a"), a.token, MERGE)
    assert shelved(m, a.lease_id)
    # Same lock, same lease: the same contender key name, re-created with a newer revision.
    reused_before = LEASES_REUSED._value.get()
    b = await acquire(m, "file:a")
    assert b.lease_id == a.lease_id and m.leases.reused == 1
    assert LEASES_REUSED._value.get() == reused_before + 1
    assert b.token > a.token
    assert b.expires_at == a.expires_at  # the TTL runs from the original grant
    remaining = await m.etcd.lease_remaining(b.lease_id)
    assert b.expires_at - time.time() <= remaining + 1  # expires_at is never late

    # The stale holder's token touches nothing of the new lock.
    assert not await m.release(key(m, "file:a"), a.token, MERGE)
    with pytest.raises(LockLost):
        await m.refresh(key(m, "file:a"), a.token, MERGE)
    stale_hold = Holding(m, key(m, "file:a"), a.token, MERGE, call_timeout=5)
    await stale_hold.start()
    lost = stale_hold.events.get_nowait()
    assert isinstance(lost, Lost) and lost.reason is LostReason.NOT_HOLDER
    await stale_hold.close()
    state = await m.describe(key(m, "file:a"))
    assert state.holder is not None and state.holder.token == b.token
    assert not shelved(m, b.lease_id)  # a held lease is off the shelf

    # Reused by another lock name too; the old name is free and its old tokens dead.
    assert await m.release(key(m, "file:a"), b.token, MERGE)
    c = await acquire(m, "file:c")
    assert c.lease_id == a.lease_id and m.leases.reused == 2
    assert (await m.describe(key(m, "file:a"))).holder is None
    assert not await m.release(key(m, "file:a"), b.token, MERGE)
    assert (await m.describe(key(m, "file:c"))).holder.token == c.token  # type: ignore[union-attr]
    assert await m.release(key(m, "file:c"), c.token, MERGE)


async def test_a_release_that_deleted_nothing_gives_no_lease_back(mutex, etcd) -> None:  # type: ignore[no-untyped-def]
    m = mutex
    # Lost lock: the lease expired (revoked here), so the key went with it.
    a = await acquire(m, "file:lost")
    await m.etcd.revoke_lease(a.lease_id)
    assert not await m.release(key(m, "file:lost"), a.token, MERGE)
    assert not shelved(m, a.lease_id)

    # Released through another replica (which never saw the token): nothing is given back
    # there, and this replica's own release then finds nothing.
    other = Mutex(m.etcd, m.keys, m.reaper, LeasePool(m.etcd, max_age=3.0))
    try:
        b = await acquire(m, "file:elsewhere")
        assert await other.release(key(m, "file:elsewhere"), b.token, MERGE)
        assert not await m.release(key(m, "file:elsewhere"), b.token, MERGE)
        assert not shelved(m, b.lease_id) and not shelved(other, b.lease_id)
    finally:
        await other.leases.close()
    c = await acquire(m, "file:next")
    assert c.lease_id not in (a.lease_id, b.lease_id) and m.leases.reused == 0


async def test_a_renewed_lease_is_never_reused(mutex) -> None:  # type: ignore[no-untyped-def]
    m = mutex
    # Refresh, then release: the mark came first, so the release keeps the lease out.
    a = await acquire(m, "file:r")
    assert (await m.refresh(key(m, "file:r"), a.token, MERGE)).token == a.token
    assert await m.release(key(m, "file:r"), a.token, MERGE)
    assert not shelved(m, a.lease_id)
    # A Hold marks too.
    b = await acquire(m, "file:h")
    hold = Holding(m, key(m, "file:h"), b.token, MERGE, call_timeout=5)
    await hold.start()
    assert isinstance(hold.events.get_nowait(), LockView)
    assert await m.release(key(m, "file:h"), b.token, MERGE)
    await hold.close()
    assert not shelved(m, b.lease_id)
    # Release, then a stale refresh: LOCK_LOST, no renewal, and the lease is reused.
    c = await acquire(m, "file:r")
    assert await m.release(key(m, "file:r"), c.token, MERGE)
    with pytest.raises(LockLost):
        await m.refresh(key(m, "file:r"), c.token, MERGE)
    d = await acquire(m, "file:r")
    assert d.lease_id == c.lease_id and d.token > c.token
    assert m.leases.reused == 1


async def test_refresh_racing_release_never_renews_a_reused_lease(mutex) -> None:  # type: ignore[no-untyped-def]
    """Whichever lands first: a successful refresh keeps the lease out of reuse; a reused
    lease means the refresh said LOCK_LOST (and so sent no renewal)."""
    m = mutex
    outcomes = set()
    for i in range(40):
        a = await acquire(m, "file:race")
        ops = [
            m.release(key(m, "file:race"), a.token, MERGE),
            m.refresh(key(m, "file:race"), a.token, MERGE),
        ]
        released, refreshed = await asyncio.gather(
            *(ops if i % 2 else ops[::-1]), return_exceptions=True
        )
        if i % 2 == 0:
            released, refreshed = refreshed, released
        assert released is True
        b = await acquire(m, "file:race")
        reused = b.lease_id == a.lease_id
        if isinstance(refreshed, LockLost):
            outcomes.add("release first")
        else:
            assert isinstance(refreshed, LockView), refreshed
            assert not reused, "a refreshed lease was reused"
            outcomes.add("refresh first")
        if reused:
            assert isinstance(refreshed, LockLost)
        assert b.token > a.token
        assert await m.release(key(m, "file:race"), b.token, MERGE)
    assert outcomes  # at least one ordering seen (typically both)


async def test_a_waiters_lease_is_not_reused_and_a_try_locks_is(mutex) -> None:  # type: ignore[no-untyped-def]
    m = mutex
    a = await acquire(m, "file:w")
    waiting = asyncio.ensure_future(acquire(m, "file:w", wait_ms=20_000))
    await one_waiter(m, "file:w")
    # A try-lock that finds the lock held leaves, and its never-renewed lease is shelved.
    with pytest.raises(LockHeld):
        await acquire(m, "file:w")
    tried = [s.id for shelf in m.leases._shelves.values() for s in shelf if s.used]
    assert len(tried) == 1
    # A waiter whose wait runs out leaves too (it takes that shelved lease), but it
    # waited, renewing the lease: not shelved again.
    with pytest.raises(LockHeld):
        await acquire(m, "file:w", wait_ms=200)
    assert m.leases.reused == 1 and not shelved(m, tried[0])
    assert await m.release(key(m, "file:w"), a.token, MERGE)
    async with asyncio.timeout(20):
        w = await waiting
    assert w.token > a.token
    assert await m.release(key(m, "file:w"), w.token, MERGE)
    assert not shelved(m, w.lease_id)  # it waited: its keepalives could outlive it
    assert shelved(m, a.lease_id)


async def test_stale_recoveries_are_counted_only_for_expired_leases(mutex) -> None:  # type: ignore[no-untyped-def]
    m = mutex

    async def waiter_after(predecessor_gone) -> float:  # type: ignore[no-untyped-def]
        before = STALE_LOCK_RECOVERIES._value.get()
        a = await acquire(m, "file:s")
        # The predecessor goes only once the waiter has read it (then its watch, from that
        # read's revision, sees the deletion); gone before that read, there is nothing the
        # waiter could have recovered from, and nothing is counted.
        read_predecessor = asyncio.Event()
        read = m.etcd.last_created_before

        async def observed(*args, **kwargs):  # type: ignore[no-untyped-def]
            found = await read(*args, **kwargs)
            if found[0] is not None:
                read_predecessor.set()
            return found

        m.etcd.last_created_before = observed  # this client only; etcd itself is real
        try:
            waiting = asyncio.ensure_future(acquire(m, "file:s", wait_ms=20_000))
            async with asyncio.timeout(20):
                await read_predecessor.wait()
            await predecessor_gone(a)
            async with asyncio.timeout(20):
                w = await waiting
        finally:
            del m.etcd.last_created_before
        assert await m.release(key(m, "file:s"), w.token, MERGE)
        return STALE_LOCK_RECOVERIES._value.get() - before

    async def release_and_reuse(a: LockView) -> None:
        assert await m.release(key(m, "file:s"), a.token, MERGE)
        # The released lease goes straight to another lock, then back to the pool.
        other = await acquire(m, "file:other")
        assert other.lease_id == a.lease_id
        assert await m.release(key(m, "file:other"), other.token, MERGE)

    async def expire(a: LockView) -> None:
        await m.etcd.revoke_lease(a.lease_id)

    assert await waiter_after(release_and_reuse) == 0
    assert await waiter_after(expire) == 1


async def test_two_acquires_race_for_one_given_back_lease(mutex) -> None:  # type: ignore[no-untyped-def]
    m = mutex
    a = await acquire(m, "file:one")
    assert await m.release(key(m, "file:one"), a.token, MERGE)
    views = await asyncio.gather(*(acquire(m, f"file:r{i}") for i in range(8)))
    leases = [v.lease_id for v in views]
    assert len(set(leases)) == 8 and leases.count(a.lease_id) == 1
    for i, v in enumerate(views):
        state = await m.describe(key(m, f"file:r{i}"))
        assert state.holder is not None and state.holder.token == v.token
        assert state.holder.lease_id == v.lease_id


async def test_a_release_racing_the_pools_age_out_keeps_the_lease_alive(etcd) -> None:  # type: ignore[no-untyped-def]
    """A spare granted ahead is taken, used and given back while its age-out timer runs:
    the timer must not revoke it (it is a released lock's lease now), and once too old it
    is dropped, not handed out and not revoked."""
    client = Etcd(etcd.endpoint, call_timeout=5)
    m = Mutex(client, KeySpace(f"/t/{uuid.uuid4().hex}/"), LeaseReaper(client))
    m.leases = pool = LeasePool(client, max_age=0.3)
    try:
        first = await acquire(m, "file:x")  # granted on the path
        second = await acquire(m, "file:y")  # busy: a spare is granted ahead

        async def spare() -> bool:
            return any(not s.used for s in pool._shelves.get(TTL, ()))

        await until(spare, "a spare granted ahead")
        third = await acquire(m, "file:z")  # takes the spare; its age-out timer runs
        assert third.lease_id not in (first.lease_id, second.lease_id)
        assert await m.release(key(m, "file:z"), third.token, MERGE)
        assert shelved(m, third.lease_id)

        async def timers_done() -> bool:  # every grant-ahead and its age-out timer ended
            return not pool._tasks

        await until(timers_done, "the age-out timers end")
        assert await client.lease_remaining(third.lease_id) > 0  # not revoked
        # Now older than max_age: not handed out; dropped, still not revoked.
        later = await acquire(m, "file:z")
        assert later.lease_id != third.lease_id
        assert not shelved(m, third.lease_id)
        assert await client.lease_remaining(third.lease_id) > 0
        await pool.close()
        assert await client.lease_remaining(third.lease_id) > 0  # close drops, too
    finally:
        await pool.close()
        await client.close()


async def test_many_contenders_on_few_names_keep_exclusion_with_reuse(mutex) -> None:  # type: ignore[no-untyped-def]
    """Acquire/release/try-lock/refresh racing over 3 names: one holder per name, tokens
    increasing per name, and no lease ever under two live locks at once."""
    m = mutex
    names = ["file:n0", "file:n1", "file:n2"]
    inside = dict.fromkeys(names, 0)
    last_token = dict.fromkeys(names, 0)
    live_leases: dict[int, str] = {}

    async def worker(w: int) -> None:
        for r in range(15):
            name = names[(w + r) % len(names)]
            try:
                view = await acquire(m, name, wait_ms=0 if r % 4 == 3 else 20_000)
            except LockHeld:
                continue
            inside[name] += 1
            assert inside[name] == 1, "two holders at once"
            assert view.token > last_token[name]
            last_token[name] = view.token
            assert view.lease_id not in live_leases, "one lease under two live locks"
            live_leases[view.lease_id] = name
            await asyncio.sleep(0)
            if r % 5 == 4:
                await m.refresh(key(m, name), view.token, MERGE)
            del live_leases[view.lease_id]
            inside[name] -= 1
            assert await m.release(key(m, name), view.token, MERGE)

    async with asyncio.timeout(120):
        await asyncio.gather(*(worker(w) for w in range(8)))
    assert m.leases.reused > 0
    for name in names:
        assert (await m.describe(key(m, name))).holder is None


async def test_through_the_service_a_stale_token_bounces_off_a_reused_lease(lock_service) -> None:  # type: ignore[no-untyped-def]
    stub = lock_service.stub
    name = f"user:alice:{uuid.uuid4().hex[:8]}"
    request = locks_pb2.AcquireRequest(key=name, owner="o", ttl_seconds=20)
    # The service's pool reuses within 0.5 s of a grant: a loaded machine may miss that,
    # so try a few pairs until a lease comes back (each pair is checked either way).
    for _ in range(20):
        old = await stub.Acquire(request)
        assert (await stub.Release(locks_pb2.ReleaseRequest(key=name, token=old.token))).released
        new = await stub.Acquire(request)
        assert new.token > old.token
        assert not (
            await stub.Release(locks_pb2.ReleaseRequest(key=name, token=old.token))
        ).released
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Refresh(locks_pb2.RefreshRequest(key=name, token=old.token))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        hold = stub.Hold()
        await hold.write(locks_pb2.HoldRequest(key=name, token=old.token))
        event = await hold.read()
        assert event.lost.reason == locks_pb2.LOST_REASON_NOT_HOLDER
        hold.cancel()
        state = await stub.Describe(locks_pb2.DescribeRequest(key=name))
        assert state.held and state.lock.token == new.token
        assert (await stub.Release(locks_pb2.ReleaseRequest(key=name, token=new.token))).released
        if new.lease_id == old.lease_id:
            break
    else:
        pytest.fail("no lease was reused in 20 acquire/release pairs")


@pytest.mark.slow
async def test_a_claim_resent_on_failover_never_gives_its_lease_back(etcd_cluster) -> None:  # type: ignore[no-untyped-def]
    """A claim re-sent to another member may also be applied by the first one later (it
    was stopped, not refused): that copy would re-create the key on the lease, so such a
    lease is not reused, even though the release deleted its key."""
    leader = etcd_cluster.leader()
    follower = (leader + 1) % 3
    endpoints = etcd_cluster.endpoints
    ordered = (endpoints[follower], *(e for i, e in enumerate(endpoints) if i != follower))
    base = options_from_settings(LocksSettings(**etcd_cluster.settings()), call_timeout=5)
    client = Etcd(dataclasses.replace(base, endpoints=ordered, prefer_first=True))
    # Age limit min(60 s, 600 s / 10): nothing here is too old to be reused.
    m = Mutex(
        client,
        KeySpace(f"/t/{uuid.uuid4().hex}/"),
        LeaseReaper(client),
        LeasePool(client, max_age=60),
    )
    try:
        a = await acquire(m, "file:f", ttl=600)
        assert await m.release(key(m, "file:f"), a.token, MERGE)
        assert shelved(m, a.lease_id)  # sent once: reused
        etcd_cluster.pause(follower)  # SIGSTOP: the claim sent there times out, unanswered
        try:
            b = await acquire(m, "file:g", ttl=600)
            assert b.lease_id == a.lease_id  # the shelved lease, claimed through a failover
            assert client.connection.current_endpoint != endpoints[follower]
            assert await m.release(key(m, "file:g"), b.token, MERGE)
            assert not shelved(m, b.lease_id)
        finally:
            etcd_cluster.resume(follower)
    finally:
        await m.leases.close()
        await client.close()
