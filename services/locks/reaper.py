"""Revokes leases the service has given up on, as soon as etcd answers again.

When etcd is unreachable for longer than a lease's TTL, Hold tells the holder its lock
is lost. etcd renews every lease's TTL when it restarts, so without this the old key
could come back as holder of a lock nobody believes in; revoking it closes that gap.
"""

from __future__ import annotations

import asyncio

from services.common.logging import get_logger
from services.locks.errors import EtcdUnavailable
from services.locks.etcd_client import Etcd
from services.locks.metrics import LEASES_TO_REVOKE

log = get_logger(__name__)

RETRY_SECONDS = 0.5


class LeaseReaper:
    """A set of leases to revoke, and the background loop that revokes them."""

    def __init__(self, etcd: Etcd) -> None:
        self._etcd = etcd
        self._pending: set[int] = set()
        self._wake = asyncio.Event()

    def doom(self, lease_id: int) -> None:
        """Revoke `lease_id` once etcd is reachable (idempotent)."""
        self._pending.add(lease_id)
        LEASES_TO_REVOKE.set(len(self._pending))
        self._wake.set()

    @property
    def pending(self) -> frozenset[int]:
        """Leases not revoked yet."""
        return frozenset(self._pending)

    async def revoke_now(self, lease_id: int) -> None:
        """Try once; on failure keep it for the background loop."""
        try:
            await self._etcd.revoke_lease(lease_id)
        except EtcdUnavailable:
            self.doom(lease_id)

    async def run(self) -> None:
        """Background loop: revoke pending leases, retrying while etcd is away."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            for lease_id in sorted(self._pending):
                try:
                    await self._etcd.revoke_lease(lease_id)
                except EtcdUnavailable:
                    continue
                self._pending.discard(lease_id)
                log.info("lost_lease_revoked", lease_id=lease_id)
            LEASES_TO_REVOKE.set(len(self._pending))
            if self._pending:
                # etcd is still away: try again shortly (a retry timer, not a sync point).
                await asyncio.sleep(RETRY_SECONDS)
                self._wake.set()
