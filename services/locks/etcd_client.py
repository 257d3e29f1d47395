"""The one module that talks to etcd, so the client library can be swapped.

It wraps `aetcd` (connection, channel, generated stubs) but sends the raw etcd v3
requests itself: the mutex needs range options aetcd's helpers do not expose (sort by
create revision, limit, max create revision) inside a transaction, and a watch stream
per waiter whose start revision closes the gap between "read" and "watch".

Not supported yet: TLS, authentication, several endpoints (one member only).
Every transport failure becomes `EtcdUnavailable` (UNAVAILABLE / ETCD_UNAVAILABLE).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import aetcd
import grpc
from aetcd import rpc

from services.locks.errors import EtcdUnavailable

# The channel reconnects by itself; keep its backoff short so a restarted etcd is
# usable again within about a second.
_CHANNEL_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
}


@dataclass(frozen=True)
class KeyValue:
    """One etcd key as the lock code needs it."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int

    @classmethod
    def from_pb(cls, kv: rpc.KeyValue) -> KeyValue:
        return cls(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.lease)


@dataclass(frozen=True)
class ClaimResult:
    """Outcome of the first mutex transaction: my key's revision and the current holder."""

    my_revision: int
    holder: KeyValue | None
    revision: int


def prefix_end(prefix: bytes) -> bytes:
    """The range end that selects every key starting with `prefix`."""
    return aetcd.utils.prefix_range_end(prefix)


class Etcd:
    """A small async etcd v3 client: leases, mutex transactions, delete watches."""

    def __init__(self, endpoint: str, call_timeout: float) -> None:
        host, _, port = endpoint.rpartition(":")
        self._client = aetcd.Client(
            host=host or "127.0.0.1", port=int(port), options=_CHANNEL_OPTIONS
        )
        self._timeout = call_timeout

    async def close(self) -> None:
        """Close the channel (pending calls fail)."""
        await self._client.close()

    async def _stubs(self) -> aetcd.Client:
        # connect() only builds the channel; it never touches the network, so the
        # service starts even when etcd is not up yet.
        await self._client.connect()
        return self._client

    async def _call(self, fn, request, call_timeout: float | None = None):  # type: ignore[no-untyped-def]
        try:
            return await fn(request, timeout=call_timeout or self._timeout)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc) from exc

    # -- leases ---------------------------------------------------------------

    async def grant_lease(self, ttl: int) -> int:
        """A new lease with `ttl` seconds; returns its id."""
        c = await self._stubs()
        resp = await self._call(c.leasestub.LeaseGrant, rpc.LeaseGrantRequest(TTL=ttl))
        return int(resp.ID)

    async def keep_alive(self, lease_id: int, call_timeout: float | None = None) -> int:
        """Renew a lease once; returns the new TTL, or 0 when the lease no longer exists."""
        c = await self._stubs()
        try:
            call = c.leasestub.LeaseKeepAlive(
                iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]),
                timeout=call_timeout or self._timeout,
            )
            async for reply in call:
                return int(reply.TTL)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc) from exc
        raise EtcdUnavailable("etcd closed the keepalive stream without an answer")

    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease (deleting its keys); a lease that is already gone is fine."""
        c = await self._stubs()
        try:
            await c.leasestub.LeaseRevoke(
                rpc.LeaseRevokeRequest(ID=lease_id), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return
            raise _translate(exc) from exc

    async def lease_remaining(self, lease_id: int) -> int:
        """Seconds left on a lease, or -1 when it has expired or was revoked."""
        c = await self._stubs()
        resp = await self._call(
            c.leasestub.LeaseTimeToLive, rpc.LeaseTimeToLiveRequest(ID=lease_id)
        )
        return int(resp.TTL)

    # -- keys -----------------------------------------------------------------

    async def claim(self, my_key: bytes, value: bytes, lease_id: int, prefix: bytes) -> ClaimResult:
        """etcd mutex.go's one round trip: create my key if absent, and read the holder.

        `if create_revision(my_key) == 0 then put(my_key) else get(my_key)`, both
        branches also fetching the key with the lowest create revision under `prefix`.
        """
        c = await self._stubs()
        get_holder = rpc.RequestOp(request_range=_first_created(prefix))
        req = rpc.TxnRequest(
            compare=[_create_revision_is(my_key, 0)],
            success=[
                rpc.RequestOp(request_put=rpc.PutRequest(key=my_key, value=value, lease=lease_id)),
                get_holder,
            ],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=my_key)), get_holder],
        )
        resp = await self._call(c.kvstub.Txn, req)
        if resp.succeeded:
            my_rev = resp.header.revision
        else:
            my_rev = resp.responses[0].response_range.kvs[0].create_revision
        holder_kvs = resp.responses[1].response_range.kvs
        holder = KeyValue.from_pb(holder_kvs[0]) if holder_kvs else None
        return ClaimResult(my_rev, holder, resp.header.revision)

    async def first_created(self, prefix: bytes) -> KeyValue | None:
        """The key under `prefix` with the lowest create revision (the lock holder)."""
        c = await self._stubs()
        resp = await self._call(c.kvstub.Range, _first_created(prefix))
        return KeyValue.from_pb(resp.kvs[0]) if resp.kvs else None

    async def last_created_before(
        self, prefix: bytes, max_create_revision: int
    ) -> tuple[KeyValue | None, int]:
        """The newest key under `prefix` created at or before `max_create_revision`.

        Returns it (or None) and the store revision of the read, from which a watch
        must start so that no deletion in between is missed.
        """
        c = await self._stubs()
        req = rpc.RangeRequest(
            key=prefix,
            range_end=prefix_end(prefix),
            sort_order=rpc.RangeRequest.DESCEND,
            sort_target=rpc.RangeRequest.CREATE,
            max_create_revision=max_create_revision,
            limit=1,
        )
        resp = await self._call(c.kvstub.Range, req)
        kv = KeyValue.from_pb(resp.kvs[0]) if resp.kvs else None
        return kv, int(resp.header.revision)

    async def by_create_revision(self, prefix: bytes, limit: int = 0) -> list[KeyValue]:
        """Every key under `prefix`, oldest create revision first."""
        c = await self._stubs()
        req = rpc.RangeRequest(
            key=prefix,
            range_end=prefix_end(prefix),
            sort_order=rpc.RangeRequest.ASCEND,
            sort_target=rpc.RangeRequest.CREATE,
            limit=limit,
        )
        resp = await self._call(c.kvstub.Range, req)
        return [KeyValue.from_pb(kv) for kv in resp.kvs]

    async def put_if_created_at(
        self, key: bytes, create_revision: int, value: bytes, lease_id: int
    ) -> bool:
        """Overwrite `key` only if it still has `create_revision`; False when it does not."""
        c = await self._stubs()
        req = rpc.TxnRequest(
            compare=[_create_revision_is(key, create_revision)],
            success=[
                rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease_id))
            ],
        )
        return bool((await self._call(c.kvstub.Txn, req)).succeeded)

    async def delete_if_created_at(self, key: bytes, create_revision: int) -> bool:
        """Delete `key` only if it still has `create_revision` (one transaction)."""
        c = await self._stubs()
        req = rpc.TxnRequest(
            compare=[_create_revision_is(key, create_revision)],
            success=[rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))],
        )
        return bool((await self._call(c.kvstub.Txn, req)).succeeded)

    async def wait_deleted(
        self, keys: Sequence[bytes], start_revision: int
    ) -> tuple[KeyValue, int]:
        """Block until one of `keys` is deleted at or after `start_revision`.

        Returns the deleted key's previous value (its lease tells who it was) and the
        revision of the deletion. One watch stream, one watch per key, delete events only.
        """
        c = await self._stubs()
        stub = rpc.WatchStub(c.channel)
        requests: asyncio.Queue[rpc.WatchRequest | None] = asyncio.Queue()
        for key in keys:
            create = rpc.WatchCreateRequest(
                key=key,
                start_revision=start_revision,
                filters=[rpc.WatchCreateRequest.FilterType.NOPUT],
                prev_kv=True,
            )
            requests.put_nowait(rpc.WatchRequest(create_request=create))

        async def request_stream():  # type: ignore[no-untyped-def]
            while (item := await requests.get()) is not None:
                yield item

        call = stub.Watch(request_stream())
        try:
            async for resp in call:
                if resp.compact_revision:
                    raise RevisionCompacted(int(resp.compact_revision))
                for event in resp.events:
                    if event.type == rpc.Event.DELETE:
                        prev = event.prev_kv if event.HasField("prev_kv") else event.kv
                        return KeyValue.from_pb(prev), int(event.kv.mod_revision)
        except grpc.aio.AioRpcError as exc:
            raise _translate(exc) from exc
        finally:
            requests.put_nowait(None)
            call.cancel()
        raise EtcdUnavailable("etcd ended the watch stream")


class RevisionCompacted(Exception):
    """The watch start revision was compacted away: read again and watch anew."""


def _first_created(prefix: bytes) -> rpc.RangeRequest:
    return rpc.RangeRequest(
        key=prefix,
        range_end=prefix_end(prefix),
        sort_order=rpc.RangeRequest.ASCEND,
        sort_target=rpc.RangeRequest.CREATE,
        limit=1,
    )


def _create_revision_is(key: bytes, revision: int) -> rpc.Compare:
    return rpc.Compare(
        key=key,
        result=rpc.Compare.EQUAL,
        target=rpc.Compare.CREATE,
        create_revision=revision,
    )


def _translate(exc: grpc.aio.AioRpcError) -> Exception:
    """Transport trouble -> EtcdUnavailable; anything else is a bug worth seeing."""
    if exc.code() in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    ):
        return EtcdUnavailable(f"etcd: {exc.code().name}: {exc.details()}")
    return exc
