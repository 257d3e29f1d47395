"""Notify's side of a trace (in-process, in-memory exporter; SQLite fans out by job,
PostgreSQL inline): an IngestBatch runs in its first event's trace, and every other
event's trace still shows notify's work on it: a span of its ingest and of the write of
its notifications, under the span its traceparent names (upload's commit)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from notify.harness import SERVICE, event
from opentelemetry import trace
from serentak.notify.v1 import notify_pb2
from support.tracing import MemorySpans, memory_spans, named

from services.common import tracing

BATCH = "/serentak.notify.v1.NotifyService/IngestBatch"


@pytest.fixture(autouse=True)
def spans() -> Iterator[MemorySpans]:
    """Tracing on before the service starts (autouse: before `notify`)."""
    with memory_spans() as memory:
        yield memory


async def test_each_event_of_a_batch_is_worked_on_in_its_own_trace(notify, spans) -> None:
    # Three events of one file, each recorded in a trace of its own (three "commits").
    events, commits = [], []
    for version in (1, 2, 3):
        with tracing.span(f"commit {version}") as commit:
            ev = event("f-traced", version)
            ev.traceparent = tracing.current_traceparent() or ""
        events.append(ev)
        commits.append(commit)
    # Sent as the relay sends a batch: the call in its first event's trace.
    await notify.stub.IngestBatch(
        notify_pb2.IngestBatchRequest(events=events),
        metadata=(*SERVICE, ("traceparent", events[0].traceparent)),
    )
    await notify.settled()
    done = await spans.wait_for(lambda s: len(named(s, "notify fanout_event")) >= 2)

    def in_trace(commit: trace.Span) -> set[str]:
        trace_id = commit.get_span_context().trace_id
        return {s.name for s in done if s.context.trace_id == trace_id}

    # The call itself is in the first event's trace, that event's work with it.
    (call,) = [s for s in named(done, BATCH) if s.kind == trace.SpanKind.SERVER]
    assert call.context.trace_id == commits[0].get_span_context().trace_id
    # Each other event: its ingest and the write of its notifications, in its own trace,
    # as children of the span its traceparent names.
    for commit in commits[1:]:
        assert {"notify ingest_event", "notify fanout_event"} <= in_trace(commit)
        for name in ("notify ingest_event", "notify fanout_event"):
            (span,) = [
                s
                for s in named(done, name)
                if s.context.trace_id == commit.get_span_context().trace_id
            ]
            assert span.parent is not None
            assert span.parent.span_id == commit.get_span_context().span_id
    # The first event's trace is the call's: no extra span there.
    assert not {"notify ingest_event", "notify fanout_event"} & in_trace(commits[0])
