"""The delivery floor for `bench_notify.py`: a bare grpc.aio NotifyService that hands each
IngestBatch's notifications straight to the open Subscribe streams.

Same client process, same streams, same stream items (the service's own columns and
`EventTemplate`, one per recipient, shared by its streams), batched the same way for a
`max_batch` stream; no database, no authentication, no inbox, no ordering checks. What it
measures (receipt -> delivery) is what gRPC, Python and the client cost on this machine
for the same fan-out, the part of commit -> delivery that no notify service in Python can
avoid.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator

import grpc
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc

from services.notify.clock import utcnow
from services.notify.fanout import EventTemplate, new_notification_state
from services.notify.fanout_writer import occurred_at
from services.notify.summaries import describe


class BareNotify(notify_pb2_grpc.NotifyServiceServicer):
    """Subscribe and IngestBatch only; `received` maps each event version to when its
    IngestBatch arrived (perf_counter)."""

    def __init__(self) -> None:
        self.received: dict[int, float] = {}
        self._streams: defaultdict[str, list[asyncio.Queue[notify_pb2.SubscribeResponse]]] = (
            defaultdict(list)
        )
        self._seq: defaultdict[str, int] = defaultdict(int)

    async def Subscribe(
        self, request: notify_pb2.SubscribeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[notify_pb2.SubscribeResponse]:
        """A position marker, then what IngestBatch queues for the caller's user."""
        token = dict(context.invocation_metadata())["authorization"]
        user = token.removeprefix("Bearer tok-")
        queue: asyncio.Queue[notify_pb2.SubscribeResponse] = asyncio.Queue()
        self._streams[user].append(queue)
        try:
            yield notify_pb2.SubscribeResponse(cursor="0")
            while True:
                first = await queue.get()
                if request.max_batch <= 1:
                    yield first
                    continue
                batch = [first.notification]
                while len(batch) < request.max_batch and not queue.empty():
                    batch.append(queue.get_nowait().notification)
                yield notify_pb2.SubscribeResponse(notifications=batch, cursor=batch[-1].cursor)
        finally:
            self._streams[user].remove(queue)

    async def IngestBatch(
        self, request: notify_pb2.IngestBatchRequest, context: grpc.aio.ServicerContext
    ) -> notify_pb2.IngestBatchResponse:
        """Queue one stream item per open stream of each event's audience."""
        now = time.perf_counter()
        moment = utcnow()
        for ev in request.events:
            self.received.setdefault(ev.version, now)
            # The service's own columns, so each stream item is the one notify would send.
            template = EventTemplate(
                new_notification_state(ev, describe(ev), occurred_at(ev), moment)
            )
            for user in ev.audience_user_ids:
                queues = self._streams.get(user)
                if not queues:
                    continue
                self._seq[user] += 1
                response = template.response(
                    {
                        "notification_id": uuid.uuid4().hex,
                        "tenant_id": ev.tenant_id,
                        "user_id": user,
                        "seq": self._seq[user],
                    }
                )
                for queue in queues:
                    queue.put_nowait(response)
        return notify_pb2.IngestBatchResponse(
            results=[notify_pb2.IngestResponse() for _ in request.events]
        )


async def serve() -> tuple[grpc.aio.Server, BareNotify, int]:
    """A started bare server on a free loopback port."""
    servicer = BareNotify()
    server = grpc.aio.server()
    notify_pb2_grpc.add_NotifyServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, servicer, port
