"""Typed errors -> gRPC status: a `SerentakError` answers with its code and ErrorInfo reason,
anything else is a bug (INTERNAL). The one place errors are mapped (rpc_wrapper.py calls it).
"""

from __future__ import annotations

import traceback

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from services.common import correlation
from services.common.database_conflicts import as_connection_lost, as_transaction_conflict
from services.common.disk_full import as_storage_full
from services.common.errors import ERROR_DOMAIN, SerentakError
from services.common.logging import get_logger
from services.common.metrics import DOMAIN_ERRORS

log = get_logger(__name__)


def to_status(exc: SerentakError) -> grpc.Status:
    """The gRPC status for a domain error, with its ErrorInfo reason and metadata."""
    info = error_details_pb2.ErrorInfo(reason=exc.reason, domain=ERROR_DOMAIN)
    info.metadata.update(exc.metadata)
    details = []
    for message in (info, *exc.status_details()):
        detail = any_pb2.Any()
        detail.Pack(message)
        details.append(detail)
    status = status_pb2.Status(code=exc.code.value[0], message=exc.message, details=details)
    return rpc_status.to_status(status)


class _Status(grpc.Status):
    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata: tuple) -> None:
        self.code, self.details, self.trailing_metadata = code, details, trailing_metadata


def _keeping_trailers(status: grpc.Status, context: grpc.aio.ServicerContext) -> grpc.Status:
    """`status` plus the trailing metadata already set on the call (the correlation id):
    abort would otherwise send only the status's own."""
    kept = tuple(context.trailing_metadata() or ())
    if not kept:
        return status
    return _Status(status.code, status.details, (*status.trailing_metadata, *kept))


def status_name(exc: BaseException) -> str:
    """The status code `fail` answers `exc` with, as metrics and logs name it."""
    if isinstance(exc, NotImplementedError):
        return grpc.StatusCode.UNIMPLEMENTED.name
    exc = as_storage_full(exc) or as_transaction_conflict(exc) or as_connection_lost(exc) or exc
    if isinstance(exc, SerentakError):
        return exc.code.name
    return grpc.StatusCode.INTERNAL.name


_CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}


def aborted_code(context: grpc.aio.ServicerContext) -> str:
    """The status a handler aborted with (context.abort sets it before raising)."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int):
        return _CODE_NAMES.get(code, "UNKNOWN")
    return "UNKNOWN"


async def fail(
    exc: BaseException, method: str, context: grpc.aio.ServicerContext, unary: bool = False
) -> None:
    """Answer the call with `exc`'s status (always raises grpc.aio.AbortError)."""
    cid = correlation.bound_or_none()
    if unary and cid is not None:
        # A unary error still goes out after initial metadata (carrying the id): the
        # call is then committed, and a client's gRPC retry policy does not re-send a
        # handler's UNAVAILABLE (a "trailers-only" answer would be re-sent). The
        # caller's own retry logic (backoff, outbox relay) stays in charge. Errors
        # are rare; success keeps the single batch.
        await context.send_initial_metadata(((correlation.METADATA_KEY, cid),))
    if isinstance(exc, NotImplementedError):
        # The generated servicer base classes raise this for RPCs not built yet.
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not implemented yet")
    typed = account_error(exc, method)
    if typed is not None:
        await context.abort_with_status(_keeping_trailers(to_status(typed), context))
    await context.abort(grpc.StatusCode.INTERNAL, internal_message(exc))


def account_error(exc: BaseException, method: str) -> SerentakError | None:
    """Count and log an answer's error: the typed error it answers with, or None for a
    bug (INTERNAL, logged with the traceback being handled)."""
    # A full disk (OSError, SQLite, PostgreSQL) is RESOURCE_EXHAUSTED, a lost database
    # connection UNAVAILABLE: neither is a bug.
    exc = as_storage_full(exc) or as_connection_lost(exc) or exc
    conflict = as_transaction_conflict(exc)
    if conflict is not None:
        # Retryable for the caller, yet a lock order somewhere is wrong: logged as a bug.
        log.error(
            "rpc_transaction_conflict",
            method=method,
            error=repr(exc),
            traceback=traceback.format_exc(),
        )
        exc = conflict
    if isinstance(exc, SerentakError):
        DOMAIN_ERRORS.labels(exc.reason).inc()
        log.info(
            "rpc_domain_error",
            method=method,
            code=exc.code.name,
            reason=exc.reason,
            error=exc.message,
        )
        return exc
    log.error("rpc_bug", method=method, error=repr(exc), traceback=traceback.format_exc())
    return None


def internal_message(exc: BaseException) -> str:
    """What a bug's INTERNAL answer says: the exception's class, nothing of its content."""
    return f"internal error: {type(exc).__name__}"
