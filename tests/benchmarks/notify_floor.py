"""The delivery floor for `bench_notify.py`: a bare grpc.aio NotifyService that hands each
IngestBatch's notifications straight to the open Subscribe streams.

Same client process, same streams, same stream items (the service's own columns and
`EventTemplate`, one per recipient, shared by its streams), batched the same way for a
`max_batch` stream; no database, no authentication, no inbox, no ordering checks. What it
measures (receipt -> delivery) is what gRPC, Python and the client cost on this machine
for the same fan-out, the part of commit -> delivery that no notify service in Python can
avoid.

`DurableNotify` (PostgreSQL) first stores what it delivers, the least a durable,
exactly-once service must: per IngestBatch one transaction on one raw psycopg connection
(no pool, no ORM) that inserts each event's inbox row (the event id that makes a
redelivery a no-op) and runs notify's own one-statement fan-out (stream positions and
one notification row per recipient), then hands the stream items over as BareNotify does.
Its receipt is the COMMIT's return, as notify's span starts at its commit.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator

import grpc
import psycopg
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc

from services.common.driver_sql import DriverStatement
from services.notify.clock import utcnow
from services.notify.fanout import EventTemplate, audience, new_notification_state
from services.notify.fanout_batch import FAN_OUT, fan_out_parameters
from services.notify.fanout_writer import occurred_at
from services.notify.inbox_rows import PG_INSERT, row_values
from services.notify.models import InboxStatus
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


class DurableNotify(BareNotify):
    """BareNotify that stores each IngestBatch in PostgreSQL (`connection`, notify's
    schema) before handing it to the streams."""

    def __init__(self, connection: psycopg.AsyncConnection) -> None:
        super().__init__()
        self._connection = connection
        self._insert = DriverStatement(PG_INSERT).sql
        self._fan_out = FAN_OUT.sql

    async def IngestBatch(
        self, request: notify_pb2.IngestBatchRequest, context: grpc.aio.ServicerContext
    ) -> notify_pb2.IngestBatchResponse:
        """Store the batch (inbox rows, then every notification) in one transaction."""
        now = utcnow()
        events = list(request.events)
        states = [new_notification_state(ev, describe(ev), occurred_at(ev), now) for ev in events]
        parameters = fan_out_parameters(
            [audience(ev) for ev in events], states, now, (), {"b_ids": [], "b_versions": []}
        )
        async with self._connection.transaction():
            for ev in events:
                await self._connection.execute(
                    self._insert, row_values(ev, InboxStatus.APPLIED, now)
                )
            await self._connection.execute(self._fan_out, parameters)
        return await super().IngestBatch(request, context)


async def serve(
    connection: psycopg.AsyncConnection | None = None,
) -> tuple[grpc.aio.Server, BareNotify, int]:
    """A started bare server on a free loopback port; durable when given `connection`."""
    servicer = BareNotify() if connection is None else DurableNotify(connection)
    # Room for thousands of streams opened at once, as notify leaves (`streams_max`).
    server = grpc.aio.server(
        options=[
            ("grpc.server.max_pending_requests", 100_000),
            ("grpc.server.max_pending_requests_hard_limit", 200_000),
        ]
    )
    notify_pb2_grpc.add_NotifyServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, servicer, port
