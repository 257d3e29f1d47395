"""Metrics every service shares, and the per-service `/metrics` endpoint.

Domain metrics live in each service's own `metrics.py`; these are the RPC-level ones.
"""

from __future__ import annotations

import platform
from importlib import metadata

import grpc
from prometheus_client import (
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)

# No `<name>_created` series beside every counter, histogram and summary child: nothing
# reads them, and they were 249 of the 1,404 lines upload serves (issue #34).
disable_created_metrics()

# The conventional gRPC server metrics (as go-grpc-prometheus / grpc-ecosystem name them), so
# stock dashboards and alerts work: method "/pkg.Service/Method" -> grpc_service, grpc_method;
# grpc_type is unary, client_stream, server_stream or bidi_stream.
RPC_LABELS = ["grpc_service", "grpc_method", "grpc_type"]
RPC_STARTED = Counter("grpc_server_started_total", "RPCs started on the server.", RPC_LABELS)
RPC_HANDLED = Counter(
    "grpc_server_handled_total",
    "RPCs completed on the server, whatever their status code.",
    [*RPC_LABELS, "grpc_code"],
)
RPC_HANDLING_SECONDS = Histogram(
    "grpc_server_handling_seconds",
    "Time from an RPC's start to its last response (the application's handling).",
    RPC_LABELS,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
DOMAIN_ERRORS = Counter(
    "serentak_domain_errors_total",
    "Typed domain errors returned to callers, by reason.",
    ["reason"],
)


BUILD_INFO = Gauge(
    "serentak_build_info",
    "Always 1; the labels say which build runs (serentak version, Python, grpcio).",
    ["version", "python_version", "grpc_version"],
)


def _version() -> str:
    try:
        return metadata.version("serentak")
    except metadata.PackageNotFoundError:  # a bare checkout without an install
        return "unknown"


BUILD_INFO.labels(_version(), platform.python_version(), grpc.__version__).set(1)


def split_method(method: str) -> tuple[str, str]:
    """The (service, method) names of a full method name "/pkg.Service/Method"."""
    service, _, name = method.lstrip("/").rpartition("/")
    return service, name


def start_metrics_endpoint(host: str, port: int) -> None:
    """Serve Prometheus text format on http://host:port/metrics (port 0: disabled)."""
    if port:
        start_http_server(port, addr=host)


# Rate limits (rate_limits/): `family` is a service's group of RPCs (writes, reads, ...),
# `scope` user or tenant: whose window was full.
RATE_LIMITED = Counter(
    "serentak_rate_limited_total",
    "Calls and stream messages refused RESOURCE_EXHAUSTED / RATE_LIMITED, by service, "
    "RPC family and scope (user or tenant).",
    ["service", "family", "scope"],
)
RATE_LIMIT_STORE_ERRORS = Counter(
    "serentak_rate_limit_store_errors_total",
    "Rate limit checks the shared store failed to answer (the call was let through).",
    ["service"],
)
# The call capacity gate (call_capacity.py); `cap` is service_calls, user_calls, streams
# (every user stream of the replica), tenant_streams or user_streams.
CAPACITY_IN_USE = Gauge(
    "serentak_capacity_in_use",
    "Slots held of each cap: calls or open streams; for tenant_streams and user_streams, "
    "the most streams any one tenant or user holds.",
    ["cap"],
)
CAPACITY_LIMIT = Gauge(
    "serentak_capacity_limit",
    "The size of each cap (one replica's, per tenant or per user).",
    ["cap"],
)
CAPACITY_REFUSED = Counter(
    "serentak_capacity_refused_total",
    "Calls refused RESOURCE_EXHAUSTED because their cap was full, by cap.",
    ["cap"],
)
