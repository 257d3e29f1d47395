"""The errors the client raises itself: `SerentakError` and its classes for what a service
refused (a gRPC code and an ErrorInfo reason each), `ConfigError` for what was refused
before any call.

The SDK's plain calls let the server's `grpc.aio.AioRpcError` through (its status and
`google.rpc.ErrorInfo` reason: see `serentak.sdk.results.rpc_reason`). The lock client
turns the lock service's refusals into the classes below, by ErrorInfo reason, so a caller
writes `except LockHeld`; and channels refuse settings that cannot work with `ConfigError`.
The server's own errors (`services.common.errors`) descend from this `SerentakError` and
mirror these names; the client imports nothing of the server.
"""

from __future__ import annotations

from typing import ClassVar

import grpc


class SerentakError(Exception):
    """Root of the service refusals this package raises as typed errors: `code` and
    `reason` as the server sent them (or would have), `metadata` the ErrorInfo metadata
    (string -> string)."""

    code: ClassVar[grpc.StatusCode] = grpc.StatusCode.UNKNOWN
    reason: ClassVar[str] = "UNKNOWN"

    def __init__(self, message: str, *, reason: str | None = None, **metadata: object) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason  # type: ignore[misc]
        self.metadata = {k: str(v) for k, v in metadata.items() if v is not None}


class ConfigError(ValueError):
    """Settings or flags that cannot work together (a bad address list, a certificate
    without its key, no credential): raised before any call, so no status of its own.
    The server's `ConfigError` is this class."""


class Unavailable(SerentakError):
    """A service cannot be reached right now (safe to retry)."""

    code = grpc.StatusCode.UNAVAILABLE
    reason = "UNAVAILABLE"


class LockHeld(SerentakError):
    """The wait ran out while someone else held the lock (ABORTED / LOCK_HELD)."""

    code = grpc.StatusCode.ABORTED
    reason = "LOCK_HELD"


class LockLost(SerentakError):
    """The lock is not the caller's any more: its token is stale or its lease expired
    (FAILED_PRECONDITION / LOCK_LOST). When a Hold stream reported the loss, its
    `metadata["lost_reason"]` names the LostReason."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "LOCK_LOST"


class SessionInFlightLimit(SerentakError):
    """A Session stream had more requests in flight than the lock service runs for one
    (RESOURCE_EXHAUSTED / SESSION_IN_FLIGHT_LIMIT); the lock client then sends a call."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "SESSION_IN_FLIGHT_LIMIT"


class LockServiceError(SerentakError):
    """A lock service refusal with no class of its own here (its code and reason kept)."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: str, **metadata: str) -> None:
        super().__init__(message, reason=reason or code.name, **metadata)
        self.code = code  # type: ignore[misc]


__all__ = [
    "ConfigError",
    "LockHeld",
    "LockLost",
    "LockServiceError",
    "SerentakError",
    "SessionInFlightLimit",
    "Unavailable",
]
