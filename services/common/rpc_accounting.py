"""Per-method RPC accounting: grpc_server_started_total, grpc_server_handled_total (with the
final status code), grpc_server_handling_seconds, and the `rpc_completed` log line."""

from __future__ import annotations

import time

import grpc

from services.common.logging import get_logger
from services.common.metrics import (
    RPC_HANDLED,
    RPC_HANDLING_SECONDS,
    RPC_STARTED,
    split_method,
)

log = get_logger(__name__)


def rpc_type(handler: grpc.RpcMethodHandler) -> str:
    """grpc_type as the conventional metrics name it."""
    if handler.request_streaming:
        return "bidi_stream" if handler.response_streaming else "client_stream"
    return "server_stream" if handler.response_streaming else "unary"


class MethodAccounting:
    """One method's metrics, with its label children bound once (and per code, once seen)
    rather than looked up on every call."""

    def __init__(self, method: str, grpc_type: str) -> None:
        self.method = method
        self._labels = (*split_method(method), grpc_type)
        # Incremented by the caller when the call starts (before its handler runs).
        self.started_total = RPC_STARTED.labels(*self._labels)
        self._handling = RPC_HANDLING_SECONDS.labels(*self._labels)
        self._handled = {"OK": RPC_HANDLED.labels(*self._labels, "OK")}

    def record(self, started: float, code: str, cid: str | None = None) -> None:
        """Count a call that began at perf_counter() `started` and ended with `code`, and
        log `rpc_completed`."""
        elapsed = time.perf_counter() - started
        self._handling.observe(elapsed)
        counter = self._handled.get(code)
        if counter is None:
            counter = self._handled[code] = RPC_HANDLED.labels(*self._labels, code)
        counter.inc()
        # A stream closed by the loop's finalizer logs from another task: the call's
        # correlation id is passed explicitly so the line keeps it.
        extra = {"correlation_id": cid} if cid else {}
        log.info(
            "rpc_completed",
            method=self.method,
            code=code,
            duration_ms=round(elapsed * 1000, 3),
            **extra,
        )
