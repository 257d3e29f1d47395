"""What one gRPC server accepts: message size, concurrent calls, keepalive policy.

A server without these lets one caller stall everyone: a 60 MiB message to a service whose
requests are a few hundred bytes is read and parsed before being refused, unlimited
concurrent calls exhaust memory and the database pool, and a client pinging without end
keeps a connection (and its buffers) alive for nothing. Each service picks its own
message size (small for locks and notify; the upload service needs a chunk plus overhead);
the rest comes from `CommonSettings`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MIB = 1024 * 1024
# What the server may send (responses are ours: listings, downloads): never the bound.
MAX_SEND_MESSAGE_BYTES = 64 * MIB


@dataclass(frozen=True)
class ServerLimits:
    """Server-side limits; `options()` turns them into grpc core channel arguments."""

    # None: grpc's own unbounded default (only for tests that want it).
    max_concurrent_rpcs: int | None = 1000
    # Ping an idle client every keepalive_time; drop it if no ack within keepalive_timeout.
    keepalive_time_ms: int = 60_000
    keepalive_timeout_ms: int = 20_000
    # Enforcement: client pings closer together than this (with no data in flight) are
    # strikes; after max_ping_strikes the server sends GOAWAY (ENHANCE_YOUR_CALM).
    # Our clients (channels.py) ping every 30 s on a connection with calls.
    min_client_ping_interval_ms: int = 20_000
    max_ping_strikes: int = 2
    # A connection with no call for this long is closed.
    max_connection_idle_ms: int = 300_000
    # Calls grpc core holds before the application takes them (grpc's defaults: 1,000, and
    # past it new calls are refused at random up to the hard limit of 3,000). A replica
    # that accepts thousands of streams at once (notify) needs room for them to arrive.
    max_pending_requests: int = 1000
    max_pending_requests_hard_limit: int = 3000

    def options(self, max_receive_message_bytes: int) -> list[tuple[str, Any]]:
        """grpc server options for these limits and the service's largest request."""
        return [
            ("grpc.max_receive_message_length", max_receive_message_bytes),
            ("grpc.max_send_message_length", MAX_SEND_MESSAGE_BYTES),
            ("grpc.keepalive_time_ms", self.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", self.keepalive_timeout_ms),
            # Pings from a client with no call open are strikes too.
            ("grpc.keepalive_permit_without_calls", 0),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", self.min_client_ping_interval_ms),
            ("grpc.http2.max_ping_strikes", self.max_ping_strikes),
            ("grpc.max_connection_idle_ms", self.max_connection_idle_ms),
            ("grpc.server.max_pending_requests", self.max_pending_requests),
            ("grpc.server.max_pending_requests_hard_limit", self.max_pending_requests_hard_limit),
        ]


def server_limits(settings: Any) -> ServerLimits:
    """The limits configured in `settings` (a `CommonSettings`)."""
    return ServerLimits(
        max_concurrent_rpcs=settings.max_concurrent_rpcs,
        keepalive_time_ms=int(settings.keepalive_time_seconds * 1000),
        keepalive_timeout_ms=int(settings.keepalive_timeout_seconds * 1000),
        min_client_ping_interval_ms=int(settings.min_client_ping_interval_seconds * 1000),
        max_ping_strikes=settings.max_ping_strikes,
        max_connection_idle_ms=int(settings.max_connection_idle_seconds * 1000),
    )
