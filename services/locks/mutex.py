"""The lock algorithm: etcd's concurrency/mutex.go, plus the fixes for its sharp edges.

Every contender for lock `name` owns one key `{prefix}{name}/{lease:x}` bound to its own
lease. The holder is the key with the lowest create revision, and that revision is the
fencing token (revisions grow across the whole cluster, across restarts).

- Uncontended: one transaction creates my key and reads the holder (`Etcd.claim`).
- Waiting: each waiter watches only the key created just before its own, so a release
  wakes one waiter (FIFO, no herd); it also watches its own key, and keeps its own lease
  alive while it waits. If its own key disappears (lease expired or revoked) it fails
  with LOCK_LOST instead of reporting ownership (etcd #12017, #19597).
- After waiting, ownership is confirmed by a transaction that succeeds only if my key
  still has my create revision.
- Release deletes the holder's key only if it still has the caller's token, in the same
  transaction (never a newer holder's key: etcd #22082). The holder's key name is
  remembered from its acquire (bounded), so a release on the same replica is that one
  transaction; otherwise the holder is read first.
- Each contender's record names the principal that acquired it (`Caller.principal`); a
  Release, Refresh or Hold must come from that principal as well as carry the token, else
  it is answered as a stale token is. The principal never changes for a create revision,
  so checking it on the record read beside the token is as good as in the transaction.
  A LOCK_HELD refusal carries no token, and the holder's owner only for who may see it.

Keys are deleted, not their leases revoked, when a contender lets go; an idle lease
without keys expires by itself within its TTL. That keeps "the predecessor's lease no
longer exists" meaning "it expired", which is how stale-lock recoveries are counted.

Lease reuse. Each lock's own lease grant is an etcd write beside the claim, so a released
lock's lease goes back to the `LeasePool` (with its original grant time: the pool hands
it out only within `max_age` of that grant, so a lock still starts with ≥ 90% of its TTL
and `expires_at` stays a true lower bound). A lease is given back only when all of these
hold, each closing one way it could break a lock:
- this replica granted it, for an uncontended acquire or a try-lock/capped contender that
  never waited (a waiter's lease was renewed by its own keepalives, whose late copies
  could extend whoever used the lease next);
- the claim transaction was sent once (a copy re-sent on failover could be applied late,
  re-creating `{name}/{lease:x}` on a lease by then someone else's: a ghost holder);
- the release's (or abandon's) own delete transaction removed that one key, with the
  token's create revision and this lease (`Etcd.delete_created_at`): a release that found
  nothing (lost lock, expired lease, released elsewhere) gives nothing back, and the
  pool's leases have exactly one key each, so the lease then has none;
- the key was never marked `renewed`. Refresh and Hold mark the holder's key (a
  transaction on its create revision) before they renew its lease by id, so a renewal
  is either ordered before the release (the release sees the mark and keeps the lease
  out of reuse) or finds the key gone and reports LOCK_LOST: a stale holder's renewal
  never extends, and a stale Hold never revokes, the next lock on the same lease.
A reused lease may create the same key name again (same lock, same lease); its create
revision, the new fencing token, is newer than every earlier one, so a stale Release,
Refresh or Hold with the old token matches nothing. A given-back lease is never revoked
by the pool (only dropped, to expire), so stale-recovery counting is unchanged, except
that an acquire whose claim fails or is cancelled before its outcome is known revokes its
lease (no ghost holder); a waiter of that lease's previous lock checking in that very
moment would count a stale recovery it was not. During a rolling upgrade, replicas from
before lease reuse renew without the mark: until all run this code, a stale renewal racing
a release there could still reach the next lock on that lease (extend it by up to a TTL).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from services.common.logging import get_logger
from services.locks.errors import EtcdUnavailable, LockHeld, LockLost
from services.locks.etcd_client import Deleted, Etcd, KeyValue, prefix_end
from services.locks.etcd_watch import RevisionCompacted
from services.locks.keys import KeySpace, LockKey
from services.locks.lease_pool import Lease, LeasePool
from services.locks.lock_views import Caller, LockState, LockView, Record, lock_view, waiter_view
from services.locks.metrics import LOCK_CONTENTION, LOCK_WAIT_SECONDS, STALE_LOCK_RECOVERIES
from services.locks.reaper import LeaseReaper

log = get_logger(__name__)


class Mutex:
    """Acquire, refresh, release and inspect locks stored in etcd."""

    def __init__(
        self, etcd: Etcd, keys: KeySpace, reaper: LeaseReaper, leases: LeasePool | None = None
    ) -> None:
        self.etcd = etcd
        self.keys = keys
        self.reaper = reaper
        self.leases = leases or LeasePool(etcd)
        # (lock folder, token) -> the holder's contender key, its principal, and its lease
        # when that may be reused after the release, for tokens this replica handed out.
        # Only a name to try: the delete still checks the create revision.
        self._holder_keys: OrderedDict[tuple[bytes, int], tuple[bytes, str, Lease | None]] = (
            OrderedDict()
        )

    def _remember(
        self, key: LockKey, token: int, my_key: bytes, principal: str, reusable: Lease | None
    ) -> None:
        self._holder_keys[(key.etcd_prefix, token)] = (my_key, principal, reusable)
        if len(self._holder_keys) > HOLDER_KEYS_REMEMBERED:
            self._holder_keys.popitem(last=False)

    def _give_back(self, lease: Lease | None, deleted: Deleted) -> None:
        """Reuse `lease` iff this very delete removed its key and nobody renewed it."""
        prev = deleted.prev
        if lease is None or prev is None or prev.lease != lease.id:
            return
        if Record.decode(prev.value).renewed:
            return
        self.leases.give_back(lease)

    # -- acquire --------------------------------------------------------------

    async def acquire(
        self,
        key: LockKey,
        owner: str,
        ttl: int,
        wait_timeout_ms: int,
        correlation_id: str,
        admit: Admission | None = None,
        *,
        caller: Caller,
    ) -> LockView:
        """Take the lock for `caller`, waiting up to `wait_timeout_ms`; LockHeld when the
        wait runs out (naming the holder only if `caller` may see it).

        `admit.check(my_revision, is_holder, counted_keys)` runs once my key exists and
        before any wait; if it raises (a cap), my key is removed and the error propagates.
        """
        started = time.monotonic()
        requested_at = time.time()
        # `file` or `user` (keys.py admits no other form): a bounded label.
        pattern = key.name.split(":", 1)[0]
        granted = await self.leases.take(ttl)
        lease = granted.id
        my_key = key.contender_key(lease)
        record = Record(
            owner, correlation_id, ttl, waiting_since=requested_at, principal=caller.principal
        )
        my_rev = 0
        reusable: Lease | None = None  # the lease, while nothing but my claim touched it
        try:
            claim = await self.etcd.claim(
                my_key,
                record.encode(),
                lease,
                key.etcd_prefix,
                counted=admit.counted if admit is not None else None,
            )
            my_rev = claim.my_revision
            reusable = granted if claim.sent_once else None
            is_holder = claim.holder is not None and claim.holder.create_revision == my_rev
            if admit is not None:
                await admit.check(my_rev, is_holder, claim.counted_keys)
            if is_holder:
                _acquired_histogram(pattern).observe(time.monotonic() - started)
                self._remember(key, my_rev, my_key, caller.principal, reusable)
                # The lease's TTL runs from its grant (a spare may be a moment older).
                expires_at = granted.granted_at + ttl
                return lock_view(key.name, my_rev, lease, record, requested_at, expires_at)
            if wait_timeout_ms == 0:
                raise _Timeout
            reusable = None  # a waiter renews its lease: late renewals could outlive it
            async with asyncio.timeout(wait_timeout_ms / 1000):
                view = await self._wait_turn(key, my_key, my_rev, lease, record)
        except (_Timeout, TimeoutError):
            await self._abandon(my_key, my_rev, lease, reusable)
            LOCK_CONTENTION.labels("failed", pattern).inc()
            LOCK_WAIT_SECONDS.labels("timed_out", pattern).observe(time.monotonic() - started)
            raise await self._held_error(key, caller) from None
        except BaseException:
            # Lost, cancelled by the caller, or etcd trouble: leave no waiter behind.
            await asyncio.shield(self._abandon(my_key, my_rev, lease, reusable))
            LOCK_CONTENTION.labels("failed", pattern).inc()
            LOCK_WAIT_SECONDS.labels("failed", pattern).observe(time.monotonic() - started)
            raise
        LOCK_CONTENTION.labels("waited", pattern).inc()
        LOCK_WAIT_SECONDS.labels("acquired", pattern).observe(time.monotonic() - started)
        self._remember(key, my_rev, my_key, caller.principal, None)
        return view

    async def _wait_turn(
        self, key: LockKey, my_key: bytes, my_rev: int, lease: int, record: Record
    ) -> LockView:
        """Wait for every older contender to go, keeping my lease alive meanwhile."""
        keeper = asyncio.create_task(self._keep_waiter_alive(lease, record.ttl))
        waiter = asyncio.create_task(self._wait_predecessors(key, my_key, my_rev))
        try:
            done, _ = await asyncio.wait({keeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if waiter not in done:
                keeper.result()  # raises: the keeper only ends on failure
            last_predecessor = waiter.result()
        finally:
            for task in (keeper, waiter):
                task.cancel()
            await asyncio.gather(keeper, waiter, return_exceptions=True)
        # Renew once more so the holder starts with its full TTL, then confirm in one
        # transaction that my key (and so my lease) survived the wait.
        refreshed_at = time.time()
        if await self.etcd.keep_alive(lease) <= 0:
            raise LockLost("lease expired while waiting", key=key.name, token=my_rev)
        acquired = dataclasses.replace(record, acquired_at=refreshed_at)
        if not await self.etcd.put_if_created_at(my_key, my_rev, acquired.encode(), lease):
            raise LockLost("own key vanished while waiting", key=key.name, token=my_rev)
        if last_predecessor is not None and await self._expired(last_predecessor):
            STALE_LOCK_RECOVERIES.inc()
            log.info("stale_lock_recovered", lock_key=key.name, lock_token=my_rev)
        return lock_view(key.name, my_rev, lease, acquired, refreshed_at, refreshed_at + record.ttl)

    async def _wait_predecessors(self, key: LockKey, my_key: bytes, my_rev: int) -> KeyValue | None:
        """mutex.go waitDeletes: until no key older than mine is left; returns the last one."""
        last: KeyValue | None = None
        while True:
            predecessor, revision = await self.etcd.last_created_before(key.etcd_prefix, my_rev - 1)
            if predecessor is None:
                return last
            try:
                deleted, _ = await self.etcd.wait_deleted([predecessor.key, my_key], revision + 1)
            except RevisionCompacted:
                continue
            if deleted.key == my_key:
                raise LockLost(
                    "own lease expired or was revoked while waiting", key=key.name, token=my_rev
                )
            last = deleted

    async def _keep_waiter_alive(self, lease: int, ttl: int) -> None:
        """Renew a waiting contender's lease every third of its TTL; raise when it is gone."""
        while True:
            await asyncio.sleep(ttl / 3)  # renewal period, not a synchronisation point
            if await self.etcd.keep_alive(lease) <= 0:
                raise LockLost("lease expired while waiting")

    async def _expired(self, kv: KeyValue) -> bool:
        return kv.lease != 0 and await self.etcd.lease_remaining(kv.lease) <= 0

    async def _abandon(
        self, my_key: bytes, my_rev: int, lease: int, reusable: Lease | None = None
    ) -> None:
        """Remove my contender key; if etcd is away, revoke the lease when it is back.

        Without my revision (the claim failed or was cancelled: it may still be applied)
        the lease is revoked, so no key of mine can outlive this.
        """
        try:
            if my_rev:
                self._give_back(reusable, await self.etcd.delete_created_at(my_key, my_rev))
            else:
                await self.etcd.revoke_lease(lease)
        except EtcdUnavailable:
            self.reaper.doom(lease)

    async def _held_error(self, key: LockKey, caller: Caller) -> LockHeld:
        # Never the holder's token (a token is what Release and Hold are asked for); the
        # holder's owner only for those who may see the holder.
        holder = (await self.describe(key)).seen_by(caller).holder
        if holder is None:
            return LockHeld("the lock was held until the wait ran out", key=key.name)
        if not holder.owner:
            return LockHeld(
                f"{key.name} is held by another principal",
                key=key.name,
                holder_expires_at=_iso(holder.expires_at),
            )
        return LockHeld(
            f"{key.name} is held by {holder.owner}",
            key=key.name,
            holder_owner=holder.owner,
            holder_expires_at=_iso(holder.expires_at),
        )

    # -- holder operations ----------------------------------------------------

    async def holder(self, key: LockKey, token: int, caller: Caller) -> KeyValue:
        """The holder's key if `token` is the holder's and `caller` acquired it; else
        LockLost (which says nothing of the holder: not its token, not who it is)."""
        kv = await self.etcd.first_created(key.etcd_prefix)
        if (
            kv is None
            or kv.create_revision != token
            or not caller.holds(Record.decode(kv.value).principal)
        ):
            raise LockLost("token is not the holder's", key=key.name, token=token)
        return kv

    async def mark_renewed(self, key: LockKey, kv: KeyValue) -> None:
        """Mark the holder's key `renewed` (once) before its lease is renewed by id.

        The mark is a transaction on the key's create revision, so it is ordered against
        the release's delete: if it lands first, the release keeps the lease out of reuse;
        if the key is gone, LockLost, and the caller must not renew that lease.
        """
        record = Record.decode(kv.value)
        if record.renewed:
            return
        marked = dataclasses.replace(record, renewed=True).encode()
        if not await self.etcd.put_if_created_at(kv.key, kv.create_revision, marked, kv.lease):
            raise LockLost("the lock was released", key=key.name, token=kv.create_revision)

    async def refresh(self, key: LockKey, token: int, caller: Caller) -> LockView:
        """Renew the holder's lease; LockLost when `token` is not `caller`'s lock any more."""
        kv = await self.holder(key, token, caller)
        await self.mark_renewed(key, kv)
        refreshed_at = time.time()
        ttl = await self.etcd.keep_alive(kv.lease)
        if ttl <= 0:
            raise LockLost("lease expired", key=key.name, token=token)
        record = Record.decode(kv.value)
        return lock_view(
            key.name,
            token,
            kv.lease,
            record,
            record.acquired_at or record.waiting_since,
            refreshed_at + ttl,
        )

    async def release(self, key: LockKey, token: int, caller: Caller) -> bool:
        """Delete the holder's key iff it still has `token` and `caller` acquired it;
        False when nothing changed."""
        remembered = self._holder_keys.get((key.etcd_prefix, token))
        if remembered is not None:
            my_key, principal, reusable = remembered
            if not caller.holds(principal):
                return False
            del self._holder_keys[(key.etcd_prefix, token)]
            # A token this replica handed out to a holder: while its key exists with that
            # create revision no older key can appear, so it is still the holder's.
            deleted = await self.etcd.delete_created_at(my_key, token)
            self._give_back(reusable, deleted)
            return deleted.released
        kv = await self.etcd.first_created(key.etcd_prefix)
        if kv is None or kv.create_revision != token:
            return False
        if not caller.holds(Record.decode(kv.value).principal):
            return False
        return await self.etcd.delete_if_created_at(kv.key, token)

    # -- inspection -----------------------------------------------------------

    async def describe(self, key: LockKey) -> LockState:
        """Holder and waiters of one lock."""
        return await self._state(key.name, await self.etcd.by_create_revision(key.etcd_prefix))

    async def list_page(
        self, tenant_root: bytes, prefix: bytes, after: str | None, page_size: int
    ) -> tuple[list[LockState], str | None]:
        """One page of the locks under `prefix` (etcd form), in key order.

        Starts after lock `after` (None: at the beginning). Returns the page and the name
        to continue after, or None on the last page. All reads of one page are at one
        etcd revision, so a page is a consistent snapshot.
        """
        start, end = prefix, prefix_end(prefix)
        if after is not None:
            # Every contender key of `after` starts with "{after}/": skip them all.
            start = max(start, prefix_end(tenant_root + after.encode() + b"/"))
        groups: dict[str, list[KeyValue]] = {}
        revision = 0
        while True:
            kvs, revision, more = await self.etcd.scan(start, end, LIST_BATCH, revision)
            for kv in kvs:
                groups.setdefault(self.keys.split(kv.key), []).append(kv)
            # One lock more than the page: the page's last lock is complete.
            if len(groups) > page_size or not more or not kvs:
                break
            start = kvs[-1].key + b"\0"
        names = list(groups)[:page_size]
        states = [
            await self._state(name, sorted(groups[name], key=lambda kv: kv.create_revision))
            for name in names
        ]
        return states, names[-1] if len(groups) > page_size else None

    async def _state(self, name: str, kvs: list[KeyValue]) -> LockState:
        if not kvs:
            return LockState(None)
        first, rest = kvs[0], kvs[1:]
        record = Record.decode(first.value)
        remaining = await self.etcd.lease_remaining(first.lease) if first.lease else -1
        holder = lock_view(
            name,
            first.create_revision,
            first.lease,
            record,
            record.acquired_at or record.waiting_since,
            time.time() + max(remaining, 0),
        )
        waiters = [
            waiter_view(kv.create_revision, kv.lease, Record.decode(kv.value)) for kv in rest
        ]
        return LockState(holder, waiters)


@dataclass(frozen=True)
class Admission:
    """A check on a new contender (a tenant cap), run once its key exists."""

    counted: bytes  # the etcd folder whose keys the claim transaction lists for `check`
    check: Callable[[int, bool, list[bytes] | None], Awaitable[None]]


# The uncontended path's histogram child per pattern, bound on first use, not per call.
_ACQUIRED: dict[str, Any] = {}


def _acquired_histogram(pattern: str) -> Any:
    child = _ACQUIRED.get(pattern)
    if child is None:
        child = _ACQUIRED[pattern] = LOCK_WAIT_SECONDS.labels("acquired", pattern)
    return child


LIST_BATCH = 512  # contender keys read per etcd request while listing
HOLDER_KEYS_REMEMBERED = 10_000  # bounded: a holder that never releases here is forgotten


class _Timeout(Exception):
    """Internal: a try-lock found the lock held."""


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
