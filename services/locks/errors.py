"""Typed errors of the lock service; the shared error mapping maps each to its gRPC status."""

from __future__ import annotations

from services.common.errors import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)


class LockHeld(Aborted):
    """The wait ran out while someone else held the lock (ABORTED / LOCK_HELD)."""

    reason = "LOCK_HELD"


class LockLost(FailedPrecondition):
    """The caller's token is not the holder's any more, or its lease expired (LOCK_LOST)."""

    reason = "LOCK_LOST"


class InvalidLockKey(InvalidArgument):
    """A lock key or prefix that is not `file:{id}` / `user:{id}:{scope}` (INVALID_LOCK_KEY)."""

    def __init__(self, field: str, message: str, **metadata: object) -> None:
        super().__init__(field, message, reason="INVALID_LOCK_KEY", **metadata)


class EtcdUnavailable(Unavailable):
    """etcd did not answer in time (UNAVAILABLE / ETCD_UNAVAILABLE); safe to retry."""

    reason = "ETCD_UNAVAILABLE"


class EtcdAuthFailed(EtcdUnavailable):
    """etcd refused the configured username/password (UNAVAILABLE / ETCD_AUTH_FAILED)."""

    reason = "ETCD_AUTH_FAILED"


class EtcdPermissionDenied(EtcdUnavailable):
    """etcd refused the request for this user/certificate (ETCD_PERMISSION_DENIED)."""

    reason = "ETCD_PERMISSION_DENIED"


class LockNotFound(NotFound):
    """A user named another tenant's key space: as if it did not exist (LOCK_NOT_FOUND)."""

    reason = "LOCK_NOT_FOUND"


class ServiceKeyForbidden(PermissionDenied):
    """A service principal may lock only `file:` keys (SERVICE_KEY_FORBIDDEN)."""

    reason = "SERVICE_KEY_FORBIDDEN"


class FileKeyForbidden(PermissionDenied):
    """A user named a `file:` key: those are the merge's (upload) and operators'
    (PERMISSION_DENIED / FILE_KEY_FORBIDDEN)."""

    reason = "FILE_KEY_FORBIDDEN"


class UserKeyForbidden(PermissionDenied):
    """A user named another user's key space `user:{other}:` (USER_KEY_FORBIDDEN)."""

    reason = "USER_KEY_FORBIDDEN"


class ServiceNotAllowed(PermissionDenied):
    """This service principal is not among those allowed to use locks."""

    reason = "SERVICE_NOT_ALLOWED"


class TenantLockLimit(ResourceExhausted):
    """The tenant already holds its cap of locks (RESOURCE_EXHAUSTED / TENANT_LOCK_LIMIT)."""

    reason = "TENANT_LOCK_LIMIT"


class TenantWaiterLimit(ResourceExhausted):
    """The tenant already has its cap of queued waiters (TENANT_WAITER_LIMIT)."""

    reason = "TENANT_WAITER_LIMIT"


class SessionInFlightLimit(ResourceExhausted):
    """A Session stream sent more concurrent requests than the server runs for one
    (RESOURCE_EXHAUSTED / SESSION_IN_FLIGHT_LIMIT)."""

    reason = "SESSION_IN_FLIGHT_LIMIT"
