"""Traces (services/common/tracing.py), in-process with the SDK's in-memory exporter: off by
default; a caller's W3C traceparent continued by the server span, which records the
correlation id; channels of the client package send the trace on; a job and an outbox
event carry the trace of the span that wrote them through the database (SQLite and
PostgreSQL), and the worker and the relay continue it (a batch of events of several
traces: in the first one's, with a span in each other's)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import grpc
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from serentak.channels import open_channel
from serentak.credentials import ClientSecurity
from serentak.events.v1 import events_pb2
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc
from sqlalchemy import select
from support.services import lock_service_app, running_app
from support.tracing import memory_spans, named, parent_of

from services.common import correlation, tracing
from services.common.jobs import JobContext, JobRegistry, NewJob, Worker, enqueue
from services.common.jobs.models import jobs
from services.common.jobs.queue import claim_jobs
from services.common.outbox import Relay, record_event
from services.common.outbox.models import outbox_events

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
ACQUIRE = "/serentak.locks.v1.LockService/Acquire"
HOLD = "/serentak.locks.v1.LockService/Hold"


class _Locks(locks_pb2_grpc.LockServiceServicer):
    """Acquire answers; Hold streams one event."""

    async def Acquire(self, request, context):  # type: ignore[no-untyped-def]
        return locks_pb2.Lock(key=request.key, correlation_id=correlation.current_correlation_id())

    async def Hold(self, request_iterator, context):  # type: ignore[no-untyped-def]
        yield locks_pb2.HoldEvent(held=locks_pb2.Lock(key="k"))


def _event(aggregate_id: str, version: int) -> events_pb2.Event:
    return events_pb2.Event(
        event_id=uuid.uuid4().hex,
        event_type="file.renamed",
        aggregate_type="file",
        aggregate_id=aggregate_id,
        version=version,
        file_renamed=events_pb2.FileRenamed(file_id=aggregate_id, new_name=f"v{version}"),
    )


def _ids(span: ReadableSpan) -> str:
    """`trace_id-span_id` in hex, as in a traceparent."""
    return f"{span.context.trace_id:032x}-{span.context.span_id:016x}"


def _hex(span: ReadableSpan) -> tuple[str, str]:
    return f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"


def test_off_by_default_nothing_is_installed() -> None:
    assert not tracing.enabled()
    assert tracing.server_interceptors() == []
    assert tracing.current_traceparent() is None
    with tracing.span("anything") as span:
        assert span is None
    assert tracing.configure(None, "serentak-test") is None
    assert not tracing.enabled()


async def test_a_callers_traceparent_is_continued_and_the_correlation_id_recorded() -> None:
    sent = f"00-{TRACE_ID}-{PARENT_ID}-01"
    with memory_spans() as exporter:
        async with running_app(lock_service_app(_Locks())) as svc:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.app.bound_port}") as ch:
                stub = locks_pb2_grpc.LockServiceStub(ch)
                md = (("traceparent", sent), (correlation.METADATA_KEY, "cid-1"))
                await stub.Acquire(locks_pb2.AcquireRequest(key="file:1"), metadata=md)
                hold = stub.Hold(iter([locks_pb2.HoldRequest()]), metadata=md)
                assert (await hold.read()).held.key == "k"
                hold.cancel()
                # Health is not traced (probes would drown the rest).
                from grpc_health.v1 import health_pb2, health_pb2_grpc

                await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
        spans = exporter.finished()
    (acquire,) = named(spans, ACQUIRE)
    (held,) = named(spans, HOLD)
    for span in (acquire, held):
        assert span.kind == trace.SpanKind.SERVER
        assert _hex(span)[0] == TRACE_ID
        assert span.parent is not None and f"{span.parent.span_id:016x}" == PARENT_ID
        assert span.attributes is not None
        assert span.attributes[tracing.CORRELATION_ATTRIBUTE] == "cid-1"
    assert not [s for s in spans if "Health" in s.name]


async def test_a_channel_of_the_client_package_sends_the_trace_on() -> None:
    with memory_spans() as exporter:
        async with running_app(lock_service_app(_Locks())) as svc:
            channel = open_channel(f"127.0.0.1:{svc.app.bound_port}", ClientSecurity())
            async with channel:
                with tracing.span("caller"):
                    await locks_pb2_grpc.LockServiceStub(channel).Acquire(
                        locks_pb2.AcquireRequest(key="file:1")
                    )
        spans = exporter.finished()
    (caller,) = named(spans, "caller")
    client, server = sorted(named(spans, ACQUIRE), key=lambda s: s.kind != trace.SpanKind.CLIENT)
    assert client.kind == trace.SpanKind.CLIENT and server.kind == trace.SpanKind.SERVER
    assert parent_of(spans, client) is caller
    assert parent_of(spans, server) is client
    assert {_hex(s)[0] for s in (caller, client, server)} == {_hex(caller)[0]}
    # Once tracing is off again, channels are plain: no interceptor left behind.
    channel = open_channel("127.0.0.1:1", ClientSecurity())
    assert not getattr(channel, "_unary_unary_interceptors", None)
    await channel.close()


async def test_a_job_continues_the_trace_it_was_enqueued_in(runtime_db) -> None:  # type: ignore[no-untyped-def]
    seen: list[trace.SpanContext] = []

    async def handler(ctx: JobContext) -> None:
        seen.append(trace.get_current_span().get_span_context())

    registry = JobRegistry()
    registry.register("traced", handler)
    worker = Worker(runtime_db.sessions, registry, worker_id="w1")
    with memory_spans() as exporter:
        with tracing.span("request") as request:
            async with runtime_db.sessions() as session, session.begin():
                await enqueue(session, NewJob("traced", {}, "p", "k1", correlation_id="cid-9"))
        # The worker runs elsewhere (its own task, no current span): only the row links them.
        async with runtime_db.sessions() as session, session.begin():
            stored = (await session.execute(select(jobs.c.traceparent))).scalar_one()
            (claimed,) = await claim_jobs(session, "w1", ["traced"], 30)
        # version 00, the request's trace and span, sampled (flags may add "random").
        assert stored.startswith(f"00-{_hex(request)[0]}-{_hex(request)[1]}-0")
        assert claimed.traceparent == stored
        await worker.execute(claimed)
        spans = exporter.finished()
    (job,) = named(spans, "job traced")
    assert parent_of(spans, job) is named(spans, "request")[0]
    assert job.attributes is not None
    assert job.attributes[tracing.CORRELATION_ATTRIBUTE] == "cid-9"
    assert job.attributes["serentak.outcome"] == "completed"
    assert seen == [job.context]


async def test_untraced_rows_store_no_traceparent(runtime_db) -> None:  # type: ignore[no-untyped-def]
    async with runtime_db.sessions() as session, session.begin():
        await enqueue(session, NewJob("t", {}, "p", "k"))
        await record_event(session, _event("f1", 1))
    async with runtime_db.sessions() as session, session.begin():
        assert (await session.execute(select(jobs.c.traceparent))).scalar_one() is None
        assert (await session.execute(select(outbox_events.c.traceparent))).scalar_one() is None


class _Recording:
    """Records the span current at each delivery: (event ids, span context)."""

    def __init__(self, batches: bool) -> None:
        self.batches = batches
        self.calls: list[tuple[list[str], trace.SpanContext]] = []
        self.events: list[events_pb2.Event] = []

    async def publish(self, event: events_pb2.Event) -> None:
        self.events.append(event)
        self.calls.append(([event.event_id], trace.get_current_span().get_span_context()))

    async def publish_many(self, events: Sequence[events_pb2.Event]) -> bool:
        if not self.batches:
            return False
        self.events.extend(events)
        ids = [e.event_id for e in events]
        self.calls.append((ids, trace.get_current_span().get_span_context()))
        return True


async def test_the_relay_publishes_an_event_in_the_trace_that_recorded_it(runtime_db) -> None:  # type: ignore[no-untyped-def]
    one_by_one = _Recording(batches=False)
    with memory_spans() as exporter:
        with tracing.span("commit"):
            async with runtime_db.sessions() as session, session.begin():
                await record_event(session, _event("f1", 1))
        await Relay(runtime_db.sessions, [one_by_one], relay_id="r1").publish_pending()
        spans = exporter.finished()
    (publish,) = named(spans, "outbox publish")
    (commit,) = named(spans, "commit")
    assert parent_of(spans, publish) is commit
    assert [context for _, context in one_by_one.calls] == [publish.context]
    assert one_by_one.events[0].traceparent[3:52] == _ids(commit)


async def test_a_batch_continues_its_first_events_trace_and_links_the_others(runtime_db) -> None:  # type: ignore[no-untyped-def]
    batching = _Recording(batches=True)
    with memory_spans() as exporter:
        for version in (1, 2, 3):
            # Three requests, three traces: each records one event of the same file.
            with tracing.span(f"request {version}"):
                async with runtime_db.sessions() as session, session.begin():
                    await record_event(session, _event("f1", version))
        await Relay(runtime_db.sessions, [batching], relay_id="r1").publish_pending()
        spans = exporter.finished()
    (batch,) = named(spans, "outbox publish_batch")
    first, second, third = (named(spans, f"request {v}")[0] for v in (1, 2, 3))
    assert parent_of(spans, batch) is first
    # The other events' traces each show the publish, under their own request.
    assert sorted(parent_of(spans, s).name for s in named(spans, "outbox publish")) == [  # type: ignore[union-attr]
        second.name,
        third.name,
    ]
    ((ids, context),) = batching.calls
    assert len(ids) == 3 and context == batch.context
    # Each event goes out with the traceparent it was recorded under.
    assert [e.traceparent[3:52] for e in batching.events] == [
        _ids(first),
        _ids(second),
        _ids(third),
    ]
