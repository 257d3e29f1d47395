"""Waking ListChanges long polls: an in-process notifier keyed by tenant.

`change_log.append` reports each tenant whose change committed (after the commit, never
before: a reader woken earlier would not see the row). A ListChanges waiting on this
replica wakes at once; a change committed by another replica is found by the waiter's own
re-read every `recheck_seconds` (one indexed query per waiter and period, only while it
waits).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from services.upload import metrics
from services.upload.errors import TooManyChangeWaiters
from services.upload.files import change_log


class ChangeSignals:
    """Per-tenant wake-ups for waiting ListChanges calls."""

    def __init__(self, recheck_seconds: float = 0.25, max_waiters: int = 500) -> None:
        self.recheck_seconds = recheck_seconds
        self._max_waiters = max_waiters
        self._count = 0
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._unsubscribe = change_log.subscribe(self.changed)

    def changed(self, tenant_id: str) -> None:
        """A change of `tenant_id` committed: wake its waiters."""
        for woken in self._waiters.get(tenant_id, ()):
            woken.set()

    @contextlib.contextmanager
    def waiting(self, tenant_id: str) -> Iterator[asyncio.Event]:
        """An event set by every change of the tenant committed while the block runs;
        CHANGE_WAITER_LIMIT when `max_waiters` calls wait already."""
        if self._count >= self._max_waiters:
            raise TooManyChangeWaiters(
                "too many ListChanges calls are waiting on this replica; retry shortly",
                max_waiters=self._max_waiters,
            )
        woken = asyncio.Event()
        self._waiters.setdefault(tenant_id, set()).add(woken)
        self._count += 1
        metrics.CHANGE_WAITERS.inc()
        try:
            yield woken
        finally:
            self._count -= 1
            metrics.CHANGE_WAITERS.dec()
            waiters = self._waiters.get(tenant_id)
            if waiters is not None:
                waiters.discard(woken)
                if not waiters:
                    del self._waiters[tenant_id]

    def close(self) -> None:
        """Stop listening (the process's other components may keep theirs)."""
        self._unsubscribe()
