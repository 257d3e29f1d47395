"""OpenTelemetry traces: off unless configured; one trace from the caller to the fan-out.

When on (`SERENTAK_OTLP_ENDPOINT`, or a test's `install(provider)`):
- every server runs the official grpc.aio server interceptor (opentelemetry-instrumentation-
  grpc), which continues a caller's W3C `traceparent`; every channel the client package
  makes (`serentak.channels`) gets the official client interceptors, which send it on;
- a few spans of ours mark the slow steps (`span`): the merge, the file lock's hold, the
  version's commit, the blob store's reads and writes, a job's run, an outbox publish;
- work that leaves the request is carried across the database: a job and an outbox
  event store the `traceparent` current when they were written (`current_traceparent`),
  and the worker and the relay continue that trace when they run them (`continued`);
  work one task does for another's call (the chunks' group commit) `resumed` its trace;
  an event carries its traceparent to notify; work on a batch of events runs in its first
  event's trace, with a span in each other event's (`in_own_traces`);
- the correlation id stays (logs, events) and is recorded on the spans
  (`CORRELATION_ATTRIBUTE`).

Off (the default), nothing is installed: no interceptor, `span` hands back one shared
no-op context manager and `current_traceparent` None, so the cost is a global's lookup.

Long-lived streams that multiplex unrelated work are not traced (the lock client's
Session carries every Acquire of a process: a span on it would belong to whichever
merge opened it); health and reflection calls neither.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import serentak.channels
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

CORRELATION_ATTRIBUTE = "serentak.correlation_id"
TRACER_NAME = "serentak"
# Not traced: health probes, reflection, and the lock Session stream (module docstring).
_UNTRACED_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.")
_UNTRACED_METHODS = ("/serentak.locks.v1.LockService/Session",)

_PROPAGATOR = TraceContextTextMapPropagator()
_NOOP: AbstractContextManager[None] = contextlib.nullcontext()


class _State:
    provider: TracerProvider | None = None
    tracer: trace.Tracer | None = None


_state = _State()


def enabled() -> bool:
    """True when spans are recorded (a provider is installed)."""
    return _state.tracer is not None


def install(provider: TracerProvider | None) -> TracerProvider | None:
    """Trace with `provider` from now on (None: stop tracing); returns the previous one.

    Servers started and channels opened afterwards get the gRPC instrumentation; ones
    already running keep what they were built with.
    """
    previous = _state.provider
    _state.provider = provider
    _state.tracer = provider.get_tracer(TRACER_NAME) if provider is not None else None
    if provider is None:
        serentak.channels.use_interceptors(())
    else:
        from opentelemetry.instrumentation.grpc import aio_client_interceptors

        serentak.channels.use_interceptors(
            aio_client_interceptors(tracer_provider=provider, filter_=_traced_call)
        )
    return previous


def configure(
    endpoint: str | None, service_name: str, sample_ratio: float = 1.0
) -> TracerProvider | None:
    """At start-up: export spans over OTLP/gRPC to `endpoint` as `service_name`, keeping
    `sample_ratio` of the traces this service starts (a caller's sampled flag wins).
    No endpoint: tracing stays off and None is returned.

    An `http://` endpoint is plaintext; `https://` uses TLS with the system's roots. The
    SDK's own OTEL_EXPORTER_OTLP_* and OTEL_BSP_* variables (headers, batch delay) apply.
    """
    if not endpoint:
        return None
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name}),
        sampler=ParentBased(TraceIdRatioBased(sample_ratio)),
    )
    exporter = OTLPSpanExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    install(provider)
    return provider


def shutdown() -> None:
    """Export what is buffered and stop tracing (at the end of a service's run)."""
    provider = install(None)
    if provider is not None:
        provider.shutdown()


def server_interceptors() -> list[Any]:
    """The official grpc.aio server interceptor when tracing is on; else none."""
    if _state.provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    return [aio_server_interceptor(tracer_provider=_state.provider, filter_=_traced_call)]


def _traced_call(details: Any) -> bool:
    """The instrumentation's filter: False for the calls not traced (module docstring)."""
    method = details.method
    if isinstance(method, bytes):  # grpc hands the server some names as bytes
        method = method.decode()
    return method not in _UNTRACED_METHODS and not method.lstrip("/").startswith(_UNTRACED_SERVICES)


def span(name: str, **attributes: Any) -> AbstractContextManager[Any]:
    """A span of ours around a block, child of the current one; attributes that are None
    are left out. A shared no-op when tracing is off."""
    tracer = _state.tracer
    if tracer is None:
        return _NOOP
    return tracer.start_as_current_span(name, attributes=_attributes(attributes))


def continued(traceparent: str | None, name: str, **attributes: Any) -> AbstractContextManager[Any]:
    """A span continuing the trace `traceparent` names (stored with a job or an outbox
    event). Without a traceparent it is a child of the current span, or a new trace's
    root."""
    tracer = _state.tracer
    if tracer is None:
        return _NOOP
    parent = _PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else None
    return tracer.start_as_current_span(name, context=parent, attributes=_attributes(attributes))


def annotate(span: Any, **attributes: Any) -> None:
    """Set attributes on a span `span`/`continued` gave (nothing when tracing is off)."""
    if span is not None:
        span.set_attributes(_attributes(attributes))


@contextlib.contextmanager
def resumed(traceparent: str | None, *, unless_current_trace: bool = False) -> Iterator[None]:
    """Make the span `traceparent` names the current one for the block, without a span
    of its own: for work one task does on behalf of another's call (a group commit).
    `unless_current_trace`: leave the current span when it is in that trace already."""
    parent = _parent(traceparent, unless_current_trace)
    if parent is None:
        yield
        return
    token = otel_context.attach(parent)
    try:
        yield
    finally:
        otel_context.detach(token)


@contextlib.contextmanager
def in_own_traces(
    traceparents: Iterable[str | None], name: str, **attributes: Any
) -> Iterator[None]:
    """For work on a batch that runs in its first item's trace: a span `name` covering
    the block in each other trace among `traceparents` (the items', e.g. events'), so
    every item's trace shows it. Those spans are not made current: what the block starts
    stays in the current trace. A no-op when tracing is off."""
    tracer = _state.tracer
    if tracer is None:
        yield
        return
    seen = {trace.get_current_span().get_span_context().trace_id}
    spans = []
    values = _attributes(attributes)
    for traceparent in traceparents:
        parent = _parent(traceparent, unless_current_trace=False)
        if parent is None:
            continue
        trace_id = trace.get_current_span(parent).get_span_context().trace_id
        if trace_id not in seen:
            seen.add(trace_id)
            spans.append(tracer.start_span(name, context=parent, attributes=values))
    try:
        yield
    finally:
        for span in spans:
            span.end()


def _parent(traceparent: str | None, unless_current_trace: bool) -> otel_context.Context | None:
    """The context `traceparent` names (None: tracing off, no or a bad traceparent, or,
    `unless_current_trace`, the current span's trace)."""
    if _state.tracer is None or not traceparent:
        return None
    parent = _PROPAGATOR.extract({"traceparent": traceparent})
    named = trace.get_current_span(parent).get_span_context()
    if not named.is_valid:
        return None
    current = trace.get_current_span().get_span_context()
    if unless_current_trace and current.is_valid and current.trace_id == named.trace_id:
        return None
    return parent


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span, to store with work done later; None
    when tracing is off or no span is current."""
    if _state.tracer is None:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


def note_correlation_id(correlation_id: str) -> None:
    """Record the correlation id on the current span (the RPC's server span)."""
    if _state.tracer is not None:
        trace.get_current_span().set_attribute(CORRELATION_ATTRIBUTE, correlation_id)


def _attributes(values: dict[str, Any]) -> dict[str, Any]:
    return {f"serentak.{k}": v for k, v in values.items() if v is not None}


__all__ = [
    "CORRELATION_ATTRIBUTE",
    "annotate",
    "configure",
    "continued",
    "current_traceparent",
    "enabled",
    "in_own_traces",
    "install",
    "note_correlation_id",
    "resumed",
    "server_interceptors",
    "shutdown",
    "span",
]
