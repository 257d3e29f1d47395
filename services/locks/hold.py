"""Hold: keep a held lock's lease alive while a stream is open, and say when it is lost.

Two tasks per hold. The keeper renews the lease every third of its TTL; when renewals
fail, it declares the lock lost once a full TTL has passed since the *sending* of the
last renewal etcd answered (etcd counts the TTL from when it received that renewal, so
this is never later than etcd's own expiry) and hands the lease to the reaper so it is
revoked when etcd is back. The watcher waits for the holder's key to be deleted (a
release, a revoke, or the lease expiring) and reports it at once. Before its first
renewal a hold marks the holder's key `renewed` (`Mutex.mark_renewed`), which keeps the
lease out of reuse: renewals and revokes by lease id never reach a later lock. Only the
principal that acquired the lock may hold it (`tenancy.py`): anyone else, even with the
token, is told NOT_HOLDER.
"""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass

from services.common.logging import get_logger
from services.common.tasks import finish
from services.locks.errors import EtcdUnavailable, LockLost
from services.locks.etcd_client import KeyValue
from services.locks.etcd_watch import RevisionCompacted
from services.locks.keys import LockKey
from services.locks.lock_views import Caller, LockView, Record
from services.locks.metrics import HOLDS_CAPPED, LOCK_RENEWALS
from services.locks.mutex import Mutex

log = get_logger(__name__)

RETRY_SECONDS = 0.25


class LostReason(enum.Enum):
    """Why a hold ended (mirrors the proto enum `LostReason`)."""

    LEASE_EXPIRED = 1
    KEY_DELETED = 2
    ETCD_UNREACHABLE = 3
    NOT_HOLDER = 4
    MAX_HOLD_EXCEEDED = 5


@dataclass(frozen=True)
class Lost:
    """The lock is gone; no more events follow."""

    reason: LostReason
    detail: str


HoldEvent = LockView | Lost


class Holding:
    """One open Hold: its background tasks and the queue of events for the stream."""

    def __init__(
        self,
        mutex: Mutex,
        key: LockKey,
        token: int,
        caller: Caller,
        call_timeout: float,
        max_hold_seconds: float | None = None,
    ) -> None:
        """Hold `key` for `caller`, who must be the principal that acquired it (`token`)."""
        self.mutex = mutex
        self.caller = caller
        # "Never extend a lock without bound": renewals stop this long after the acquire.
        self.max_hold_seconds = max_hold_seconds
        self.key = key
        self.token = token
        self.call_timeout = call_timeout
        self.events: asyncio.Queue[HoldEvent] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._lost = False
        self._hold_deadline: float | None = None

    async def start(self) -> None:
        """Check the token, renew once, then keep renewing and watching in the background."""
        try:
            kv = await self.mutex.holder(self.key, self.token, self.caller)
            # Before renewing by lease id: a lease whose key is marked is never reused, so
            # every renewal and revoke of this hold only ever touches this lock's lease.
            await self.mutex.mark_renewed(self.key, kv)
        except LockLost as exc:
            self._report(Lost(LostReason.NOT_HOLDER, exc.message))
            return
        sent = time.time()
        sent_mono = time.monotonic()
        ttl = await self.mutex.etcd.keep_alive(kv.lease)
        if ttl <= 0:
            self._report(Lost(LostReason.LEASE_EXPIRED, "the lease expired before the hold"))
            return
        record = Record.decode(kv.value)
        self.events.put_nowait(self._view(kv, record, sent + ttl))
        self._hold_deadline = None
        if self.max_hold_seconds is not None:
            acquired = record.acquired_at or record.waiting_since or sent
            self._hold_deadline = sent_mono + (acquired + self.max_hold_seconds - sent)
        self._tasks = [
            asyncio.create_task(self._keep_alive(kv, record, sent_mono)),
            asyncio.create_task(self._watch(kv)),
        ]

    async def close(self) -> None:
        """Stop renewing (the stream ended): the lease now expires on its own."""
        await finish(*self._tasks)

    def _report(self, lost: Lost) -> None:
        if not self._lost:
            self._lost = True
            log.info(
                "lock_hold_lost",
                lock_key=self.key.name,
                lock_token=self.token,
                reason=lost.reason.name,
                detail=lost.detail,
            )
            self.events.put_nowait(lost)

    def _view(self, kv: KeyValue, record: Record, expires_at: float) -> LockView:
        return LockView(
            key=self.key.name,
            token=self.token,
            owner=record.owner,
            lease_id=kv.lease,
            acquired_at=record.acquired_at or record.waiting_since,
            expires_at=expires_at,
            correlation_id=record.correlation_id,
            ttl_seconds=record.ttl,
            principal=record.principal,
        )

    async def _keep_alive(self, kv: KeyValue, record: Record, last_ok_mono: float) -> None:
        ttl = record.ttl or 2
        period = ttl / 3
        next_at = last_ok_mono + period
        while True:
            if self._hold_deadline is not None:
                next_at = min(next_at, self._hold_deadline)
            # Renewal timer, not a synchronisation point.
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if self._hold_deadline is not None and time.monotonic() >= self._hold_deadline:
                # Reported first (the watcher then sees the deletion; one report only),
                # then the lease is revoked so the next waiter gets the lock now.
                self._report(
                    Lost(
                        LostReason.MAX_HOLD_EXCEEDED,
                        f"held longer than the maximum of {self.max_hold_seconds}s",
                    )
                )
                HOLDS_CAPPED.inc()
                self.mutex.reaper.doom(kv.lease)
                return
            deadline = last_ok_mono + ttl
            sent, sent_mono = time.time(), time.monotonic()
            budget = min(self.call_timeout, deadline - sent_mono)
            try:
                if budget <= 0:
                    raise TimeoutError
                async with asyncio.timeout(budget):
                    granted = await self.mutex.etcd.keep_alive(kv.lease, call_timeout=budget)
            except (EtcdUnavailable, TimeoutError):
                if time.monotonic() >= deadline:
                    self.mutex.reaper.doom(kv.lease)
                    self._report(
                        Lost(LostReason.ETCD_UNREACHABLE, f"no renewal reached etcd for {ttl}s")
                    )
                    return
                next_at = min(time.monotonic() + RETRY_SECONDS, deadline)
                continue
            if granted <= 0:
                self._report(Lost(LostReason.LEASE_EXPIRED, "etcd no longer has the lease"))
                return
            LOCK_RENEWALS.inc()
            last_ok_mono = sent_mono
            next_at = sent_mono + period
            self.events.put_nowait(self._view(kv, record, sent + granted))

    async def _watch(self, kv: KeyValue) -> None:
        start = kv.mod_revision + 1
        while True:
            try:
                deleted, _ = await self.mutex.etcd.wait_deleted([kv.key], start)
            except RevisionCompacted:
                try:
                    kv = await self.mutex.holder(self.key, self.token, self.caller)
                except LockLost:
                    self._report(Lost(LostReason.KEY_DELETED, "the lock key was deleted"))
                    return
                start = kv.mod_revision + 1
                continue
            except EtcdUnavailable:
                # The keeper decides when silence means loss; re-watch when etcd is back.
                await asyncio.sleep(RETRY_SECONDS)
                continue
            try:
                expired = await self.mutex.etcd.lease_remaining(deleted.lease) <= 0
            except EtcdUnavailable:
                expired = False
            if expired:
                self._report(Lost(LostReason.LEASE_EXPIRED, "the lease expired"))
            else:
                self._report(Lost(LostReason.KEY_DELETED, "the lock key was deleted (released)"))
            return
