"""Where the relay publishes events: anything with `async publish(event)`.

A subscriber must be idempotent by `event_id`: a relay that crashes between publishing
and marking the event published sends it again. It should also apply events of one
aggregate in version order (the relay sends them in that order, one aggregate at a time).
A subscriber may also take a batch (`publish_many`): the relay then sends an aggregate's
pending events in one call instead of a round trip each.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import grpc
from serentak.channels import open_channel
from serentak.credentials import ClientSecurity
from serentak.events.v1 import events_pb2
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc

from services.common import tracing
from services.common.correlation import METADATA_KEY
from services.common.logging import get_logger
from services.common.outbox.store import OutboxEvent

log = get_logger(__name__)

# Bytes of events per IngestBatch call: well under notify's 1 MiB message limit (an event
# to 1,000 collaborators is ~10 KiB).
MAX_BATCH_BYTES = 256 * 1024
INGEST = "serentak.notify.v1.NotifyService/Ingest"
INGEST_BATCH = "serentak.notify.v1.NotifyService/IngestBatch"


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
        # Cleared when the notify service answers UNIMPLEMENTED (older than IngestBatch).
        self._batches = True

    def _stub(self) -> notify_pb2_grpc.NotifyServiceStub:
        # Created lazily so the channel belongs to the running event loop.
        if self._channel is None:
            # Ingest(Batch) is idempotent by event_id: gRPC may resend it on UNAVAILABLE.
            self._channel = open_channel(
                self._address, self._security, retry=[INGEST, INGEST_BATCH]
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

    async def publish_many(self, events: Sequence[events_pb2.Event]) -> bool:
        """Deliver `events` in order with IngestBatch (as few calls as MAX_BATCH_BYTES
        allows); False, having sent nothing, when notify predates IngestBatch. Any RPC
        error propagates (the relay then publishes one by one)."""
        if not self._batches:
            return False
        metadata = []
        if events and events[0].correlation_id:
            metadata.append((METADATA_KEY, events[0].correlation_id))
        for chunk in _by_size(events):
            try:
                await self._stub().IngestBatch(
                    notify_pb2.IngestBatchRequest(events=chunk),
                    metadata=metadata,
                    timeout=self._timeout,
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    self._batches = False
                    return False
                raise
        return True

    async def close(self) -> None:
        """Close the channel (at shutdown)."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


def _by_size(events: Sequence[events_pb2.Event]) -> Iterator[list[events_pb2.Event]]:
    """`events` in order, in runs of at most MAX_BATCH_BYTES (at least one event each)."""
    chunk: list[events_pb2.Event] = []
    size = 0
    for event in events:
        n = event.ByteSize()
        if chunk and size + n > MAX_BATCH_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(event)
        size += n
    if chunk:
        yield chunk


async def send_batch(
    subscribers: Sequence[Subscriber], batch: list[tuple[str, OutboxEvent]]
) -> bool:
    """Send `batch` ((aggregate key, row) in publish order) with one call per subscriber;
    False when it was not sent as a batch (a subscriber without `publish_many`, a refusal,
    a failure): the relay then publishes its events one by one."""
    events = [row.event for _, row in batch]
    first_key, first = batch[0]
    try:
        # One call for events of several traces: it continues the first event's, and each
        # other event's trace gets an `outbox publish` span of it.
        with (
            tracing.continued(
                first.traceparent,
                "outbox publish_batch",
                aggregate=first_key,
                events=len(events),
                correlation_id=events[0].correlation_id,
            ),
            tracing.in_own_traces(
                [row.traceparent for _, row in batch[1:]],
                "outbox publish",
                aggregate=first_key,
                batch=len(events),
            ),
        ):
            for subscriber in subscribers:
                publish_many = getattr(subscriber, "publish_many", None)
                if publish_many is None or not await publish_many(events):
                    return False
    except Exception as exc:
        log.info(
            "outbox_batch_publish_failed",
            aggregate=first_key,
            events=len(events),
            error=f"{type(exc).__name__}: {exc}",
        )
        return False
    return True
