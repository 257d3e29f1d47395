"""Traces for tests: the SDK's in-memory exporter in this process, and an OTLP receiver
for service processes.

`memory_spans()` installs a tracer provider (services.common.tracing.install) whose spans
land in an `InMemorySpanExporter` as each one ends; `OtlpReceiver` is a gRPC server
implementing the official `opentelemetry.proto.collector.trace.v1.TraceService`, which
keeps every span the processes export to it, with the service name of its resource.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.common import tracing


@contextlib.contextmanager
def memory_spans() -> Iterator[InMemorySpanExporter]:
    """Trace into memory for the block (servers and channels made inside it are traced)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    previous = tracing.install(provider)
    try:
        yield exporter
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

    async def Export(  # noqa: N802 - the generated servicer's method name
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

    async def wait_for(self, found: Callable[[list[ExportedSpan]], bool], timeout: float) -> None:
        """Return once `found(spans)` holds (checked at each export), or raise TimeoutError."""
        async with asyncio.timeout(timeout):
            while not found(self.spans):
                self._changed.clear()
                await self._changed.wait()
