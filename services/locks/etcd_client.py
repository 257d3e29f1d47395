"""The one module the lock code uses to talk to etcd, so the client library can be swapped.

It sends raw etcd v3 requests (etcd3aio's generated stubs, over `EtcdConnection`: several
members, TLS with client certificates, auth tokens, keepalive, failover): the mutex needs
range options client helpers rarely expose (sort by create revision, limit, max create
revision) inside a transaction, and a watch stream per waiter whose start revision
closes the gap between "read" and "watch".

Every transport failure, after failover to the other members, becomes
`EtcdUnavailable` (UNAVAILABLE / ETCD_UNAVAILABLE).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from etcd3aio import prefix_range_end
from etcd3aio._protobuf import kv_pb2, rpc_pb2_grpc
from etcd3aio._protobuf import rpc_pb2 as rpc

from services.locks.errors import EtcdAuthFailed, EtcdPermissionDenied, EtcdUnavailable
from services.locks.etcd_connection import (
    REQUIRE_LEADER,
    EtcdConnection,
    EtcdOptions,
    parse_endpoints,
    retryable,
    token_invalid,
)
from services.locks.etcd_watch import DeletionWatch


@dataclass(frozen=True)
class KeyValue:
    """One etcd key as the lock code needs it."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int

    @classmethod
    def from_pb(cls, kv: kv_pb2.KeyValue) -> KeyValue:
        return cls(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.lease)


@dataclass(frozen=True)
class ClaimResult:
    """Outcome of the first mutex transaction: my key's revision and the current holder."""

    my_revision: int
    holder: KeyValue | None
    revision: int
    # The keys (no values) under `counted` as of my key's creation, when asked for and
    # read in the same transaction (a re-sent claim reads them separately).
    counted_keys: list[bytes] | None = None
    # The transaction was sent exactly once. Only then is it sure that no copy of it can
    # still be applied later (a timed-out copy may be applied after its answer was lost),
    # so only then may the lease be reused once my key is deleted: a late copy would
    # re-create my key on a lease that by then belongs to someone else.
    sent_once: bool = False


@dataclass(frozen=True)
class Deleted:
    """Outcome of a delete by create revision."""

    released: bool  # the key with that create revision is gone (by this call or before)
    # The deleted key as it was, set only when this very transaction deleted it (exactly
    # one key, with that create revision): the only case that says whose lease it was.
    prev: KeyValue | None = None


def prefix_end(prefix: bytes) -> bytes:
    """The range end that selects every key starting with `prefix`."""
    return prefix_range_end(prefix)


# A stub builds a callable per etcd method (~10 µs); the lock hot path sends two calls per
# pair, so stubs are built once per channel (a handful live at once; closed ones age out).
@functools.lru_cache(maxsize=32)
def _kv(channel: grpc.aio.Channel) -> rpc_pb2_grpc.KVStub:
    return rpc_pb2_grpc.KVStub(channel)


@functools.lru_cache(maxsize=32)
def _lease(channel: grpc.aio.Channel) -> rpc_pb2_grpc.LeaseStub:
    return rpc_pb2_grpc.LeaseStub(channel)


class Etcd:
    """A small async etcd v3 client: leases, mutex transactions, delete watches."""

    def __init__(
        self, endpoints: str | Sequence[str] | EtcdOptions, call_timeout: float = 5.0
    ) -> None:
        options = (
            endpoints
            if isinstance(endpoints, EtcdOptions)
            else EtcdOptions(parse_endpoints(endpoints), call_timeout=call_timeout)
        )
        # Channels are made on first use, inside the event loop; nothing touches the
        # network here, so the service starts even when etcd is not up yet.
        self.connection = EtcdConnection(options)
        self._timeout = options.call_timeout

    async def close(self) -> None:
        """Close the channels (pending calls fail)."""
        await self.connection.close()

    async def _txn(self, request: rpc.TxnRequest) -> rpc.TxnResponse:
        return await self.connection.unary(lambda ch: _kv(ch).Txn, request)

    async def _txn_counting_sends(self, request: rpc.TxnRequest) -> tuple[rpc.TxnResponse, int]:
        """`_txn`, and how many times the transaction was sent: after a failover a copy
        sent earlier may have been applied too (its answer lost with the member)."""
        sends = 0

        async def send(channel: grpc.aio.Channel, md: object, budget: float) -> rpc.TxnResponse:
            nonlocal sends
            sends += 1
            return await _kv(channel).Txn(request, timeout=budget, metadata=md)

        return await self.connection.with_failover(send), sends

    async def _range(self, request: rpc.RangeRequest) -> rpc.RangeResponse:
        return await self.connection.unary(lambda ch: _kv(ch).Range, request)

    # -- leases ---------------------------------------------------------------

    async def grant_lease(self, ttl: int) -> int:
        """A new lease with `ttl` seconds; returns its id.

        Re-sent on another member after a failure; a lease granted by a lost answer
        has no keys and expires by itself.
        """
        resp = await self.connection.unary(
            lambda ch: _lease(ch).LeaseGrant, rpc.LeaseGrantRequest(TTL=ttl)
        )
        return int(resp.ID)

    async def keep_alive(self, lease_id: int, call_timeout: float | None = None) -> int:
        """Renew a lease once; returns the new TTL, or 0 when the lease no longer exists."""

        async def once(channel: grpc.aio.Channel, md: object, budget: float) -> int:
            call = _lease(channel).LeaseKeepAlive(
                iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), timeout=budget, metadata=md
            )
            try:
                async for reply in call:
                    return int(reply.TTL)
            finally:
                call.cancel()
            raise EtcdUnavailable("etcd closed the keepalive stream without an answer")

        return int(await self.connection.with_failover(once, call_timeout or self._timeout))

    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease (deleting its keys); a lease that is already gone is fine."""
        try:
            await self.connection.unary(
                lambda ch: _lease(ch).LeaseRevoke, rpc.LeaseRevokeRequest(ID=lease_id)
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return
            raise

    async def lease_remaining(self, lease_id: int) -> int:
        """Seconds left on a lease, or -1 when it has expired or was revoked."""
        resp = await self.connection.unary(
            lambda ch: _lease(ch).LeaseTimeToLive, rpc.LeaseTimeToLiveRequest(ID=lease_id)
        )
        return int(resp.TTL)

    # -- keys -----------------------------------------------------------------

    async def claim(
        self,
        my_key: bytes,
        value: bytes,
        lease_id: int,
        prefix: bytes,
        counted: bytes | None = None,
    ) -> ClaimResult:
        """etcd mutex.go's one round trip: create my key if absent, and read the holder.

        `if create_revision(my_key) == 0 then put(my_key) else get(my_key)`, both
        branches also fetching the key with the lowest create revision under `prefix`.
        With `counted` (a tenant's folder), the put branch also lists the keys under it,
        in the same transaction: the snapshot at my key's revision, which is exactly the
        keys created at or before it that still exist (no extra round trip for a cap).
        """
        get_holder = rpc.RequestOp(request_range=_first_created(prefix))
        success = [
            rpc.RequestOp(request_put=rpc.PutRequest(key=my_key, value=value, lease=lease_id)),
            get_holder,
        ]
        if counted is not None:
            success.append(
                rpc.RequestOp(
                    request_range=rpc.RangeRequest(
                        key=counted, range_end=prefix_end(counted), keys_only=True
                    )
                )
            )
        req = rpc.TxnRequest(
            compare=[_create_revision_is(my_key, 0)],
            success=success,
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=my_key)), get_holder],
        )
        resp, attempts = await self._txn_counting_sends(req)
        counted_keys = None
        if resp.succeeded:
            my_rev = resp.header.revision
            if counted is not None:
                counted_keys = [kv.key for kv in resp.responses[2].response_range.kvs]
        else:
            my_rev = resp.responses[0].response_range.kvs[0].create_revision
        holder_kvs = resp.responses[1].response_range.kvs
        holder = KeyValue.from_pb(holder_kvs[0]) if holder_kvs else None
        return ClaimResult(my_rev, holder, resp.header.revision, counted_keys, attempts == 1)

    async def first_created(self, prefix: bytes) -> KeyValue | None:
        """The key under `prefix` with the lowest create revision (the lock holder)."""
        resp = await self._range(_first_created(prefix))
        return KeyValue.from_pb(resp.kvs[0]) if resp.kvs else None

    async def last_created_before(
        self, prefix: bytes, max_create_revision: int
    ) -> tuple[KeyValue | None, int]:
        """The newest key under `prefix` created at or before `max_create_revision`.

        Returns it (or None) and the store revision of the read, from which a watch
        must start so that no deletion in between is missed.
        """
        req = rpc.RangeRequest(
            key=prefix,
            range_end=prefix_end(prefix),
            sort_order=rpc.RangeRequest.DESCEND,
            sort_target=rpc.RangeRequest.CREATE,
            max_create_revision=max_create_revision,
            limit=1,
        )
        resp = await self._range(req)
        kv = KeyValue.from_pb(resp.kvs[0]) if resp.kvs else None
        return kv, int(resp.header.revision)

    async def by_create_revision(self, prefix: bytes, limit: int = 0) -> list[KeyValue]:
        """Every key under `prefix`, oldest create revision first."""
        req = rpc.RangeRequest(
            key=prefix,
            range_end=prefix_end(prefix),
            sort_order=rpc.RangeRequest.ASCEND,
            sort_target=rpc.RangeRequest.CREATE,
            limit=limit,
        )
        resp = await self._range(req)
        return [KeyValue.from_pb(kv) for kv in resp.kvs]

    async def created_up_to(self, prefix: bytes, max_create_revision: int) -> list[KeyValue]:
        """Keys (no values) under `prefix` created at or before `max_create_revision`."""
        req = rpc.RangeRequest(
            key=prefix,
            range_end=prefix_end(prefix),
            max_create_revision=max_create_revision,
            keys_only=True,
        )
        return [KeyValue.from_pb(kv) for kv in (await self._range(req)).kvs]

    async def scan(
        self, start: bytes, end: bytes, limit: int, revision: int = 0
    ) -> tuple[list[KeyValue], int, bool]:
        """Keys in [start, end) in key order, at most `limit`, read at `revision` (0: now).

        Returns them, the revision read (pass it back to continue the same snapshot) and
        whether more keys follow.
        """
        req = rpc.RangeRequest(key=start, range_end=end, limit=limit, revision=revision)
        resp = await self._range(req)
        kvs = [KeyValue.from_pb(kv) for kv in resp.kvs]
        return kvs, revision or int(resp.header.revision), bool(resp.more)

    async def put_if_created_at(
        self, key: bytes, create_revision: int, value: bytes, lease_id: int
    ) -> bool:
        """Overwrite `key` only if it still has `create_revision`; False when it does not."""
        req = rpc.TxnRequest(
            compare=[_create_revision_is(key, create_revision)],
            success=[
                rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease_id))
            ],
        )
        return bool((await self._txn(req)).succeeded)

    async def put_if_modified_at(
        self, key: bytes, mod_revision: int, value: bytes, lease_id: int
    ) -> tuple[int, KeyValue | None]:
        """Write `key` only if its mod revision is still `mod_revision` (0: it does not
        exist), one transaction: (the write's revision, None), or (0, the key as it is
        now, None when absent)."""
        req = rpc.TxnRequest(
            compare=[
                rpc.Compare(
                    key=key,
                    result=rpc.Compare.EQUAL,
                    target=rpc.Compare.MOD,
                    mod_revision=mod_revision,
                )
            ],
            success=[
                rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease_id))
            ],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=key))],
        )
        resp = await self._txn(req)
        if resp.succeeded:
            return int(resp.header.revision), None
        kvs = resp.responses[0].response_range.kvs
        return 0, KeyValue.from_pb(kvs[0]) if kvs else None

    async def delete_if_created_at(self, key: bytes, create_revision: int) -> bool:
        """Delete `key` only if it still has `create_revision` (one transaction)."""
        return (await self.delete_created_at(key, create_revision)).released

    async def delete_created_at(self, key: bytes, create_revision: int) -> Deleted:
        """Delete `key` only if it still has `create_revision` (one transaction).

        `prev` is the deleted key (value, lease) when this transaction deleted it. A
        failover can re-send the transaction after the first copy was applied (the answer
        was lost with the member). The re-sent copy then finds the key gone; that counts
        as released, since nothing can re-create a key with an old create revision, but
        has no `prev`: who deleted it is not known.
        """
        req = rpc.TxnRequest(
            compare=[_create_revision_is(key, create_revision)],
            success=[
                rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key, prev_kv=True))
            ],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=key, keys_only=True))],
        )
        resp, attempts = await self._txn_counting_sends(req)
        if resp.succeeded:
            gone = resp.responses[0].response_delete_range
            prev = None
            if gone.deleted == 1 and len(gone.prev_kvs) == 1:
                kv = KeyValue.from_pb(gone.prev_kvs[0])
                prev = kv if kv.create_revision == create_revision else None
            return Deleted(True, prev)
        key_gone = not resp.responses[0].response_range.kvs
        return Deleted(attempts > 1 and key_gone)

    async def wait_deleted(
        self, keys: Sequence[bytes], start_revision: int
    ) -> tuple[KeyValue, int]:
        """Block until one of `keys` is deleted at or after `start_revision`.

        Returns the deleted key's previous value (its lease tells who it was) and the
        revision of the deletion. One watch stream, one watch per key, delete events only.
        When the stream breaks (a member died, lost its leader, forgot the token) the
        watch is opened again on another member from the same start revision, so no
        deletion is missed; EtcdUnavailable once no member took it for a call timeout.
        """
        loop = asyncio.get_running_loop()
        conn = self.connection
        refreshed = False
        failing_since: float | None = None
        while True:
            index, channel = conn.pick()
            watch = DeletionWatch(channel, (), keys, start_revision)
            try:
                md = await conn.metadata()
                watch.metadata = (*md, REQUIRE_LEADER)
                found = await watch.run()
            except (EtcdAuthFailed, EtcdPermissionDenied):
                raise
            except EtcdUnavailable:
                found = None  # no token to be had right now (e.g. mid-election): retry
            except grpc.aio.AioRpcError as exc:
                if token_invalid(exc) and not refreshed:
                    refreshed = True
                    with contextlib.suppress(EtcdUnavailable):
                        await conn.token_rejected(md)
                    continue
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    raise EtcdPermissionDenied(f"etcd refused the watch: {exc.details()}") from exc
                if not retryable(exc):
                    raise
                found = None
            if found is not None:
                prev, revision = found
                return KeyValue.from_pb(prev), revision
            # The stream broke without an answer: try the next member.
            conn.failed(index)
            now = loop.time()
            if watch.established:
                failing_since = None  # it worked until now: a fresh failure
            failing_since = failing_since or now
            if now - failing_since > self._timeout:
                raise EtcdUnavailable("etcd: no member kept a watch stream open")
            await asyncio.sleep(0.1)  # retry timer between members, not a sync point


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
