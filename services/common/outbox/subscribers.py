"""Where the relay publishes events: anything with `async publish(event)`.

A subscriber must be idempotent by `event_id`: a relay that crashes between publishing
and marking the event published sends it again. It should also apply events of one
aggregate in version order (the relay sends them in that order, one aggregate at a time).
"""

from __future__ import annotations

from typing import Protocol

import grpc
from serentak.events.v1 import events_pb2
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc

from services.common.channels import ClientSecurity, open_channel
from services.common.correlation import METADATA_KEY


class Subscriber(Protocol):
    """Receives published events; raising means "not delivered, send it again later"."""

    async def publish(self, event: events_pb2.Event) -> None:
        """Deliver `event`; return only once the subscriber has it durably."""
        ...


class GrpcIngestSubscriber:
    """Publishes to the notify service's `Ingest` as this service's principal."""

    def __init__(
        self, address: str, security: ClientSecurity, timeout_seconds: float = 10.0
    ) -> None:
        self._address = address
        self._security = security
        self._timeout = timeout_seconds
        self._channel: grpc.aio.Channel | None = None

    def _stub(self) -> notify_pb2_grpc.NotifyServiceStub:
        # Created lazily so the channel belongs to the running event loop.
        if self._channel is None:
            # Ingest is idempotent by event_id: gRPC may resend it on UNAVAILABLE.
            self._channel = open_channel(
                self._address, self._security, retry=["serentak.notify.v1.NotifyService/Ingest"]
            )
        return notify_pb2_grpc.NotifyServiceStub(self._channel)

    async def publish(self, event: events_pb2.Event) -> None:
        """Call Ingest; any RPC error propagates and the relay retries later."""
        metadata = []
        if event.correlation_id:
            metadata.append((METADATA_KEY, event.correlation_id))
        await self._stub().Ingest(
            notify_pb2.IngestRequest(event=event), metadata=metadata, timeout=self._timeout
        )

    async def close(self) -> None:
        """Close the channel (at shutdown)."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
