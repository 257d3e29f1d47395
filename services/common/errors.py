"""The root of every typed domain error, and the gRPC status each class maps to.

A service raises one of these (or its own subclass, declared in its `errors.py`); the
error mapping (rpc_status.py) turns it into the status code and a `google.rpc.ErrorInfo` reason.
Anything else escaping a handler is a bug and becomes INTERNAL.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import serentak.errors
from google.protobuf import duration_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2

ERROR_DOMAIN = "serentak.dev"


class SerentakError(serentak.errors.SerentakError):
    """Root of all domain errors. Subclasses fix `code` and usually `reason`.

    The client's root (`serentak.errors.SerentakError`) gives the shape: `code`, `reason`
    and the ErrorInfo `metadata`, so one `except` of the client's root catches a refusal
    whether a service raised it here or the client read it from a status."""

    def status_details(self) -> list[Message]:
        """Status details besides the ErrorInfo (e.g. RetryInfo); none by default."""
        return []


class InvalidArgument(SerentakError):
    """Bad input; `field` names the offending request field."""

    code = grpc.StatusCode.INVALID_ARGUMENT
    reason = "INVALID_ARGUMENT"

    def __init__(self, field: str, message: str, *, reason: str | None = None, **md: object):
        super().__init__(f"{field}: {message}", reason=reason, field=field, **md)
        self.field = field


class NotFound(SerentakError):
    code = grpc.StatusCode.NOT_FOUND
    reason = "NOT_FOUND"


class AlreadyExists(SerentakError):
    code = grpc.StatusCode.ALREADY_EXISTS
    reason = "ALREADY_EXISTS"


class FailedPrecondition(SerentakError):
    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "FAILED_PRECONDITION"


class Aborted(SerentakError):
    """A lost race or a stale token: the caller may re-read and retry."""

    code = grpc.StatusCode.ABORTED
    reason = "ABORTED"


class ResourceExhausted(SerentakError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "RESOURCE_EXHAUSTED"


class RateLimited(ResourceExhausted):
    """The caller made too many of these calls; `google.rpc.RetryInfo` says when to retry."""

    reason = "RATE_LIMITED"

    def __init__(self, message: str, *, retry_after_seconds: float, limit: str, **md: str) -> None:
        super().__init__(
            message, retry_after_seconds=f"{retry_after_seconds:.3f}", limit=limit, **md
        )
        self.retry_after_seconds = retry_after_seconds

    def status_details(self) -> list[Message]:
        """A RetryInfo with the delay before the caller's window has room again."""
        return [retry_info(self.retry_after_seconds)]


class CapacityExhausted(ResourceExhausted):
    """A cap on calls or open streams is full (services/common/call_capacity.py): the
    reason names the cap (STREAM_LIMIT_USER, ...); `google.rpc.RetryInfo` says when to
    try again."""

    def __init__(
        self, message: str, *, reason: str, cap: str, limit: int, retry_after_seconds: float
    ) -> None:
        super().__init__(
            message,
            reason=reason,
            cap=cap,
            limit=limit,
            retry_after_seconds=f"{retry_after_seconds:.3f}",
        )
        self.cap = cap
        self.retry_after_seconds = retry_after_seconds

    def status_details(self) -> list[Message]:
        """A RetryInfo with the delay before the caller should try again."""
        return [retry_info(self.retry_after_seconds)]


def retry_info(seconds: float) -> error_details_pb2.RetryInfo:
    """A `google.rpc.RetryInfo` asking the caller to wait `seconds` before retrying."""
    delay = duration_pb2.Duration()
    delay.FromNanoseconds(int(seconds * 1e9))
    return error_details_pb2.RetryInfo(retry_delay=delay)


class Unauthenticated(SerentakError):
    code = grpc.StatusCode.UNAUTHENTICATED
    reason = "UNAUTHENTICATED"


class PermissionDenied(SerentakError):
    code = grpc.StatusCode.PERMISSION_DENIED
    reason = "PERMISSION_DENIED"


class Unavailable(SerentakError):
    """A dependency (etcd, another service) cannot be reached right now."""

    code = grpc.StatusCode.UNAVAILABLE
    reason = "UNAVAILABLE"


def causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and what it wraps, outermost first: SQLAlchemy's `.orig`, then the causes."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        orig = getattr(current, "orig", None)
        current = (
            orig if isinstance(orig, BaseException) else current.__cause__ or current.__context__
        )
