"""Metrics every service shares, and the per-service `/metrics` endpoint.

Domain metrics live in each service's own `metrics.py`; these are the RPC-level ones.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram, start_http_server

RPC_REQUESTS = Counter(
    "serentak_rpc_requests_total",
    "gRPC calls handled, by method and status code.",
    ["method", "code"],
)
RPC_DURATION = Histogram(
    "serentak_rpc_duration_seconds",
    "Time from a gRPC call's start to its last response, by method.",
    ["method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
DOMAIN_ERRORS = Counter(
    "serentak_domain_errors_total",
    "Typed domain errors returned to callers, by reason.",
    ["reason"],
)


def start_metrics_endpoint(host: str, port: int) -> None:
    """Serve Prometheus text format on http://host:port/metrics (port 0: disabled)."""
    if port:
        start_http_server(port, addr=host)


RATE_LIMITED = Counter(
    "serentak_rate_limited_total",
    "Calls refused RESOURCE_EXHAUSTED / RATE_LIMITED by the per-caller rate limit, by RPC.",
    ["rpc"],
)
