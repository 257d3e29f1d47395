"""The merge's handle on the lock service, connected on first use.

`build_app` runs before the service's event loop starts (`run_service` calls it, then
`asyncio.run`), and a grpc.aio channel belongs to the loop it was created on; so the
`LockClient` is created lazily, inside the running loop.

Two ways to hold a file's lock: `hold` (Acquire, a Hold stream that cancels the body on
loss, Release: the merge's commit) and `briefly` (Acquire, then Release sent after the
body without waiting for its answer: UploadFile's one short transaction). `briefly` needs
no Hold stream because its body is one transaction whose write is fenced: a lock lost
meanwhile is caught by the fencing check, and the lease's TTL bounds the hold if the
release never arrives.

With tracing on, either is a span (`lock hold`) from the wait for the lock to the end of
the body, with the fencing token, around the lock service's calls and the commit made
under it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager

from serentak.credentials import ClientSecurity
from serentak.errors import SerentakError
from serentak.sdk.locks import HeldLock, LockClient

from services.common import tracing
from services.common.logging import get_logger

log = get_logger(__name__)

# How long shutdown waits for releases still in flight before closing the channel.
_RELEASE_DRAIN_S = 5.0


class FileLocks:
    """`hold("file:{id}")` through a `LockClient` made on first use."""

    def __init__(self, address: str, owner: str, security: ClientSecurity | None = None) -> None:
        self._address = address
        self._owner = owner
        self._security = security
        self._client: LockClient | None = None
        self._releases: set[asyncio.Task[None]] = set()

    @property
    def client(self) -> LockClient:
        """The connected client (created now if needed; call inside the event loop)."""
        if self._client is None:
            self._client = LockClient(self._address, owner=self._owner, security=self._security)
        return self._client

    def hold(
        self, key: str, tenant_id: str, ttl: int = 30, wait_timeout: float = 30.0
    ) -> AbstractAsyncContextManager[HeldLock]:
        """See `LockClient.hold`; `tenant_id` is the file's tenant."""
        held = self.client.hold(key, ttl=ttl, wait_timeout=wait_timeout, tenant_id=tenant_id)
        return _traced(held, key) if tracing.enabled() else held

    @contextlib.asynccontextmanager
    async def briefly(
        self, key: str, tenant_id: str, ttl: int = 30, wait_timeout: float = 30.0
    ) -> AsyncIterator[int]:
        """Hold `key` for one short, fenced write: yields the fencing token; the release
        goes out after the body without the caller waiting for it (module docstring)."""
        with tracing.span("lock hold", lock_key=key, ttl=ttl, briefly=True) as span:
            lock = await self.client.acquire(key, ttl, wait_timeout, tenant_id)
            tracing.annotate(span, fencing_token=lock.token)
            try:
                yield lock.token
            finally:
                self._release_later(key, lock.token, tenant_id)

    def _release_later(self, key: str, token: int, tenant_id: str) -> None:
        task = asyncio.create_task(self._release(key, token, tenant_id))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, key: str, token: int, tenant_id: str) -> None:
        try:
            await self.client.release(key, token, tenant_id)
        except SerentakError as err:
            # The lease expires on its own (its TTL): the next holder waits at most that.
            log.info("lock_release_failed", lock_key=key, lock_token=token, error=str(err))

    async def close(self) -> None:
        """Close the channel if one was opened (after the releases in flight)."""
        if self._releases:
            await asyncio.wait(set(self._releases), timeout=_RELEASE_DRAIN_S)
        if self._client is not None:
            await self._client.close()
            self._client = None


@contextlib.asynccontextmanager
async def _traced(held: HeldLock, key: str) -> AsyncIterator[HeldLock]:
    """`held` inside a `lock hold` span."""
    with tracing.span("lock hold", lock_key=key, ttl=held.ttl) as span:
        async with held as lock:
            tracing.annotate(span, fencing_token=lock.token)
            yield lock
