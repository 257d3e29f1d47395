"""Traces for tests: the SDK's in-memory exporter in this process, and an OTLP receiver
for service processes.

`memory_spans()` installs a tracer provider (services.common.tracing.install) whose spans
land in an `InMemorySpanExporter` as each one ends (`MemorySpans.wait_for` waits for
one); `OtlpReceiver` is a gRPC server implementing the official
`opentelemetry.proto.collector.trace.v1.TraceService`, which keeps every span the
processes export to it, with the service name of its resource.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.common import tracing


class MemorySpans:
    """The spans of this process, kept by the SDK's InMemorySpanExporter as each ends."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self._ended = asyncio.Event()

    def finished(self) -> tuple[ReadableSpan, ...]:
        """Every span ended so far, in the order they ended."""
        return self.exporter.get_finished_spans()

    async def wait_for(
        self, found: Callable[[tuple[ReadableSpan, ...]], bool], deadline_s: float = 30
    ) -> tuple[ReadableSpan, ...]:
        """Every finished span, once `found(them)` holds (checked as each span ends)."""
        async with asyncio.timeout(deadline_s):
            while not found(spans := self.finished()):
                self._ended.clear()
                await self._ended.wait()
        return spans

    def on_end(self, span: ReadableSpan) -> None:
        """A span ended (spans end on the event loop's thread here)."""
        self._ended.set()


class _Ended(SpanProcessor):
    def __init__(self, spans: MemorySpans) -> None:
        self._spans = spans

    def on_end(self, span: ReadableSpan) -> None:
        self._spans.on_end(span)


@contextlib.contextmanager
def memory_spans() -> Iterator[MemorySpans]:
    """Trace into memory for the block (servers and channels made inside it are traced)."""
    spans = MemorySpans()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans.exporter))
    provider.add_span_processor(_Ended(spans))
    previous = tracing.install(provider)
    try:
        yield spans
    finally:
        tracing.install(previous)
        provider.shutdown()


def named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    """The spans called `name`."""
    return [s for s in spans if s.name == name]


def parent_of(spans: tuple[ReadableSpan, ...], span: ReadableSpan) -> ReadableSpan | None:
    """`span`'s parent among `spans` (None: a root, or a parent in another process)."""
    if span.parent is None:
        return None
    found = [s for s in spans if s.context.span_id == span.parent.span_id]
    return found[0] if found else None


def ancestors(spans: tuple[ReadableSpan, ...], span: ReadableSpan) -> list[str]:
    """The names of `span`'s ancestors, nearest first."""
    names: list[str] = []
    current = parent_of(spans, span)
    while current is not None:
        names.append(current.name)
        current = parent_of(spans, current)
    return names


@dataclass(frozen=True)
class ExportedSpan:
    """One span an OTLP exporter sent: its process's service name, trace id (hex) and
    name, its own and its parent's span id (hex, "" for a root)."""

    service: str
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, received: list[ExportedSpan], changed: Callable[[], None]) -> None:
        self._received = received
        self._changed = changed

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: object
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            service = next(
                (
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                ),
                "",
            )
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    self._received.append(
                        ExportedSpan(
                            service,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.name,
                        )
                    )
        self._changed()
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """An OTLP/gRPC trace receiver on a free loopback port (start it in the test's loop)."""

    def __init__(self) -> None:
        self.spans: list[ExportedSpan] = []
        self._changed = asyncio.Event()
        self._server = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(
            _TraceService(self.spans, self._changed.set), self._server
        )
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        """What SERENTAK_OTLP_ENDPOINT is set to."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Listen."""
        await self._server.start()

    async def stop(self) -> None:
        """Stop listening."""
        await self._server.stop(None)

    async def wait_for(
        self, found: Callable[[list[ExportedSpan]], bool], deadline_s: float = 60
    ) -> None:
        """Return once `found(spans)` holds (checked at each export), or raise TimeoutError."""
        async with asyncio.timeout(deadline_s):
            while not found(self.spans):
                self._changed.clear()
                await self._changed.wait()
