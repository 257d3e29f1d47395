"""Outbox dead letters (issue 11, item 7): an event the subscriber refuses for good
(INVALID_ARGUMENT, FAILED_PRECONDITION, PERMISSION_DENIED, ...) is moved to the dead
letters at once, counted, listed and replayed with the AdminService; a transient failure
(UNAVAILABLE) is retried as before; the aggregate's later events are not held back.
A real gRPC Ingest endpoint; SQLite and PostgreSQL."""

from __future__ import annotations

import json
import uuid

import grpc
from serentak.admin.v1 import admin_pb2, admin_pb2_grpc
from serentak.credentials import ClientSecurity, ClientToken
from serentak.events.v1 import events_pb2
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from sqlalchemy import func, select
from support.services import running_app

from services.common.admin import admin_servicer
from services.common.auth import Authenticator
from services.common.errors import InvalidArgument, Unavailable
from services.common.grpc_server import ServiceApp, Servicer
from services.common.jobs import JobRegistry, Worker
from services.common.jobs.metrics import OUTBOX_DEAD_LETTERS
from services.common.jobs.runtime import JobRuntime, RuntimeOptions
from services.common.outbox import GrpcIngestSubscriber, Relay, record_event
from services.common.outbox.dead_letters import OUTBOX_PUBLISH_JOB
from services.common.outbox.models import outbox_events

SERVICE_MD = (("authorization", "Bearer dev-ops"),)  # admin RPCs need the ops role
AS_UPLOAD = ClientSecurity(token=ClientToken(token="dev-service-upload"))
NOTIFY = notify_pb2.DESCRIPTOR.services_by_name["NotifyService"].full_name


class PickyIngest(notify_pb2_grpc.NotifyServiceServicer):
    """Refuses the event ids in `refuse` (INVALID_ARGUMENT) and answers UNAVAILABLE to the
    first `flaky` calls; records what it accepts."""

    def __init__(self) -> None:
        self.refuse: set[str] = set()
        self.flaky = 0
        self.accepted: list[tuple[str, int]] = []

    async def Ingest(self, request, context):  # type: ignore[no-untyped-def]
        event = request.event
        if self.flaky:
            self.flaky -= 1
            raise Unavailable("notify is restarting")
        if event.event_id in self.refuse:
            raise InvalidArgument("event.audience_user_ids", "a user id is too long")
        self.accepted.append((event.aggregate_id, event.version))
        return notify_pb2.IngestResponse()


def _event(aggregate_id: str, version: int) -> events_pb2.Event:
    return events_pb2.Event(
        event_id=uuid.uuid4().hex,
        event_type="file.shared",
        aggregate_type="file",
        aggregate_id=aggregate_id,
        version=version,
    )


def _dead_lettered() -> float:
    return sum(
        s.value
        for m in OUTBOX_DEAD_LETTERS.collect()
        for s in m.samples
        if s.name.endswith("_total")
    )


async def _drain(relay: Relay) -> None:
    """Publish rounds until the outbox is empty or a round publishes nothing."""
    while await relay.publish_pending():
        pass


async def test_a_refused_event_is_dead_lettered_and_replayable(runtime_db) -> None:  # type: ignore[no-untyped-def]
    ingest = PickyIngest()
    notify = ServiceApp(
        "notify",
        "127.0.0.1",
        0,
        0,
        [Servicer(notify_pb2_grpc.add_NotifyServiceServicer_to_server, ingest, NOTIFY)],
    )
    admin = ServiceApp(
        "admin",
        "127.0.0.1",
        0,
        0,
        [admin_servicer(runtime_db.sessions, Authenticator.dev())],
    )
    async with running_app(notify) as notify_running, running_app(admin) as admin_running:
        subscriber = GrpcIngestSubscriber(f"127.0.0.1:{notify_running.app.bound_port}", AS_UPLOAD)
        relay = Relay(runtime_db.sessions, [subscriber], relay_id="r1")
        events = [_event("f1", v) for v in (1, 2, 3)]
        ingest.refuse.add(events[1].event_id)
        async with runtime_db.sessions() as session, session.begin():
            for event in events:
                await record_event(session, event)
        before = _dead_lettered()
        await _drain(relay)
        # v2 was refused once and dead-lettered at once; v3 was not held back behind it.
        assert ingest.accepted == [("f1", 1), ("f1", 3)]
        assert _dead_lettered() == before + 1
        async with runtime_db.sessions() as session, session.begin():
            left = await session.scalar(
                select(func.count())
                .select_from(outbox_events)
                .where(outbox_events.c.published_at.is_(None))
            )
        assert left == 0  # the refused event left the outbox: nothing waits behind it

        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{admin_running.app.bound_port}"
        ) as channel:
            stub = admin_pb2_grpc.AdminServiceStub(channel)
            listed = await stub.ListDeadLetters(
                admin_pb2.ListDeadLettersRequest(job_type=OUTBOX_PUBLISH_JOB), metadata=SERVICE_MD
            )
            [dead] = listed.dead_letters
            assert dead.error_type == "grpc.StatusCode.INVALID_ARGUMENT"
            assert dead.error_class == "permanent" and dead.partition_key == "file:f1"
            payload = json.loads(dead.payload_json)
            assert (payload["event_id"], payload["version"]) == (events[1].event_id, 2)
            stats = await stub.QueueStats(admin_pb2.QueueStatsRequest(), metadata=SERVICE_MD)
            assert stats.dead_letter_count == 1
            # The cause is fixed; replay puts the event back in the outbox (once).
            ingest.refuse.clear()
            replay = await stub.ReplayDeadLetter(
                admin_pb2.ReplayDeadLetterRequest(id=dead.id), metadata=SERVICE_MD
            )
            assert replay.enqueued
        registry = JobRegistry()
        JobRuntime(runtime_db.sessions, registry, RuntimeOptions(node_id="t"))  # registers it
        worker = Worker(runtime_db.sessions, registry, worker_id="w")
        while await worker.run_once():
            pass
        await _drain(relay)
        assert ingest.accepted == [("f1", 1), ("f1", 3), ("f1", 2)]
        await subscriber.close()


async def test_a_transient_failure_is_retried_not_dead_lettered(runtime_db) -> None:  # type: ignore[no-untyped-def]
    ingest = PickyIngest()
    ingest.flaky = 1
    notify = ServiceApp(
        "notify",
        "127.0.0.1",
        0,
        0,
        [Servicer(notify_pb2_grpc.add_NotifyServiceServicer_to_server, ingest, NOTIFY)],
    )
    async with running_app(notify) as running:
        subscriber = GrpcIngestSubscriber(f"127.0.0.1:{running.app.bound_port}", AS_UPLOAD)
        relay = Relay(runtime_db.sessions, [subscriber], relay_id="r1")
        async with runtime_db.sessions() as session, session.begin():
            await record_event(session, _event("f2", 1))
            await record_event(session, _event("f2", 2))
        before = _dead_lettered()
        assert await relay.publish_pending() == 0  # UNAVAILABLE: the file waits, in order
        assert ingest.accepted == []
        relay._backoff.clear()  # skip the backoff delay instead of sleeping through it
        await _drain(relay)
        assert ingest.accepted == [("f2", 1), ("f2", 2)]
        assert _dead_lettered() == before
        await subscriber.close()
