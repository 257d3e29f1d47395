"""A service's /metrics as Prometheus scrapes it: the RPC counters are there, and no
`_created` series (prometheus_client adds one per counter, histogram and summary child
unless told not to: 249 of 1,404 lines on upload's endpoint, issue #34)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import grpc
from serentak.notify.v1 import notify_pb2, notify_pb2_grpc
from support.services import service_process


def test_the_metrics_endpoint_serves_no_created_series(tmp_path: Path) -> None:
    with service_process("notify", tmp_path) as notify:
        with grpc.insecure_channel(notify.address) as channel:
            stub = notify_pb2_grpc.NotifyServiceStub(channel)
            # A labelled counter and histogram child each: what would carry a `_created`.
            stub.GetUnreadCount(
                notify_pb2.GetUnreadCountRequest(),
                metadata=(("authorization", "Bearer dev-alice"),),
                timeout=30,
            )
        url = f"http://127.0.0.1:{notify.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            lines = resp.read().decode().splitlines()
    samples = [line for line in lines if line and not line.startswith("#")]
    assert any(
        line.startswith("grpc_server_handled_total{") and "GetUnreadCount" in line
        for line in samples
    ), samples[:20]
    assert any(line.startswith("grpc_server_handling_seconds_bucket{") for line in samples)
    assert [line for line in lines if _name(line).endswith("_created")] == []


def _name(line: str) -> str:
    """The metric a sample, `# HELP` or `# TYPE` line is about."""
    if line.startswith("# "):
        parts = line.split()
        return parts[2] if len(parts) > 2 else ""
    return line.split("{")[0].split(" ")[0]
