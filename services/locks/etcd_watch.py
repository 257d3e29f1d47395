"""A watch stream for the deletion of a contender's predecessor keys (`Etcd.wait_deleted`).

Delete events only (NOPUT), with the previous value (its lease tells who it was), from a
start revision that closes the gap between "read" and "watch". `Etcd.wait_deleted` reopens
it on another member when the stream breaks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
from etcd3aio._protobuf import kv_pb2, rpc_pb2_grpc
from etcd3aio._protobuf import rpc_pb2 as rpc

from services.locks.errors import EtcdPermissionDenied


class DeletionWatch:
    """One watch stream for the deletion of any of `keys` from `start_revision` on."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        metadata: tuple[tuple[str, str], ...],
        keys: Sequence[bytes],
        start_revision: int,
    ) -> None:
        self.channel = channel
        self.metadata = metadata
        self.keys = keys
        self.start_revision = start_revision
        self.established = False  # etcd confirmed the watch (the stream worked)

    async def run(self) -> tuple[kv_pb2.KeyValue, int] | None:
        """The first delete event (the key's previous value and the deletion's revision), or
        None when the stream ends early."""
        requests: asyncio.Queue[rpc.WatchRequest | None] = asyncio.Queue()
        for key in self.keys:
            create = rpc.WatchCreateRequest(
                key=key,
                start_revision=self.start_revision,
                filters=[rpc.WatchCreateRequest.FilterType.NOPUT],
                prev_kv=True,
            )
            requests.put_nowait(rpc.WatchRequest(create_request=create))

        async def request_stream():  # type: ignore[no-untyped-def]
            while (item := await requests.get()) is not None:
                yield item

        stub = rpc_pb2_grpc.WatchStub(self.channel)
        call = stub.Watch(request_stream(), metadata=self.metadata)
        try:
            async for resp in call:
                if resp.compact_revision:
                    raise RevisionCompacted(int(resp.compact_revision))
                if resp.canceled:
                    if "permission denied" in resp.cancel_reason:
                        raise EtcdPermissionDenied(f"etcd refused the watch: {resp.cancel_reason}")
                    return None  # e.g. the member lost its leader: watch elsewhere
                if resp.created:
                    self.established = True
                for event in resp.events:
                    if event.type == kv_pb2.Event.DELETE:
                        prev = event.prev_kv if event.HasField("prev_kv") else event.kv
                        return prev, int(event.kv.mod_revision)
        finally:
            requests.put_nowait(None)
            call.cancel()
        return None


class RevisionCompacted(Exception):
    """The watch start revision was compacted away: read again and watch anew."""
