"""Per-tenant caps on held locks and queued waiters, exact under concurrency.

A cap checked before creating one's key could be overrun by contenders racing past the
check together. So the check runs right after a contender's key exists, counting only
the tenant's keys created at or before it (etcd's max_create_revision): with revisions
totally ordered, the contender that would be one too many always sees every earlier one
and steps back (its key is removed by the mutex's usual abandon path). At worst a
contender is refused while an earlier one is leaving at the same moment; the cap itself is
never exceeded. The claim transaction that creates the key normally lists the tenant's keys
in the same round trip (`Etcd.claim(counted=...)`); only a re-sent claim reads them again.
"""

from __future__ import annotations

from services.locks.errors import TenantLockLimit, TenantWaiterLimit
from services.locks.etcd_client import Etcd
from services.locks.keys import KeySpace


class TenantCaps:
    """Counts a tenant's locks and waiters in etcd and refuses the one past the cap."""

    def __init__(self, etcd: Etcd, keys: KeySpace, max_held: int, max_waiters: int) -> None:
        self.etcd = etcd
        self.keys = keys
        self.max_held = max_held
        self.max_waiters = max_waiters

    async def admit(
        self, tenant: str, my_revision: int, holder: bool, keys: list[bytes] | None = None
    ) -> None:
        """Raise TenantLockLimit/TenantWaiterLimit if my key made the tenant exceed a cap.

        `holder`: my key made me the holder of a new lock (else I am queued as a waiter).
        `keys`: the tenant's keys as of my key's creation, when the claim read them.
        """
        if keys is None:
            kvs = await self.etcd.created_up_to(self.keys.tenant_root(tenant), my_revision)
            keys = [kv.key for kv in kvs]
        locks = len({self.keys.split(key) for key in keys})
        if holder and locks > self.max_held:
            raise TenantLockLimit(
                f"tenant {tenant} already holds {self.max_held} locks",
                tenant_id=tenant,
                limit=self.max_held,
            )
        waiters = len(keys) - locks
        if not holder and waiters > self.max_waiters:
            raise TenantWaiterLimit(
                f"tenant {tenant} already has {self.max_waiters} waiters queued",
                tenant_id=tenant,
                limit=self.max_waiters,
            )
