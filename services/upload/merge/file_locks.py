"""The merge's handle on the lock service, connected on first use.

`build_app` runs before the service's event loop starts (`run_service` calls it, then
`asyncio.run`), and a grpc.aio channel belongs to the loop it was created on; so the
`LockClient` is created lazily, inside the running loop.
"""

from __future__ import annotations

from serentak.credentials import ClientSecurity
from serentak.sdk.locks import HeldLock, LockClient


class FileLocks:
    """`hold("file:{id}")` through a `LockClient` made on first use."""

    def __init__(self, address: str, owner: str, security: ClientSecurity | None = None) -> None:
        self._address = address
        self._owner = owner
        self._security = security
        self._client: LockClient | None = None

    @property
    def client(self) -> LockClient:
        """The connected client (created now if needed; call inside the event loop)."""
        if self._client is None:
            self._client = LockClient(self._address, owner=self._owner, security=self._security)
        return self._client

    def hold(
        self,
        key: str,
        tenant_id: str,
        ttl: int = 30,
        wait_timeout: float = 30.0,
        *,
        watch: bool = True,
    ) -> HeldLock:
        """See `LockClient.hold`; `tenant_id` is the file's tenant."""
        return self.client.hold(
            key, ttl=ttl, wait_timeout=wait_timeout, tenant_id=tenant_id, watch=watch
        )

    async def close(self) -> None:
        """Close the channel if one was opened."""
        if self._client is not None:
            await self._client.close()
            self._client = None
