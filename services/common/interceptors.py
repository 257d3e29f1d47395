"""Server interceptors: correlation id binding, and typed errors -> gRPC status.

Both wrap the method handler's behaviour so they run inside the RPC's own task, where
context variables (the correlation id, structlog's bound keys) belong to that call only.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from services.common import correlation
from services.common.auth import Authenticator
from services.common.disk_full import as_storage_full
from services.common.errors import ERROR_DOMAIN, SerentakError
from services.common.logging import get_logger
from services.common.metrics import (
    DOMAIN_ERRORS,
    RPC_HANDLED,
    RPC_HANDLING_SECONDS,
    RPC_STARTED,
    split_method,
)

log = get_logger(__name__)

Behaviour = Callable[..., Any]
# Wraps a behaviour: (behaviour, method name, is_response_stream) -> new behaviour.
Wrapper = Callable[[Behaviour, str, bool], Behaviour]


def _rewrap(handler: grpc.RpcMethodHandler, method: str, wrap: Wrapper) -> grpc.RpcMethodHandler:
    """Rebuild `handler` with its behaviour wrapped, keeping its (de)serializers."""
    kinds = (
        ("unary_unary", grpc.unary_unary_rpc_method_handler, False),
        ("unary_stream", grpc.unary_stream_rpc_method_handler, True),
        ("stream_unary", grpc.stream_unary_rpc_method_handler, False),
        ("stream_stream", grpc.stream_stream_rpc_method_handler, True),
    )
    for attr, factory, streams in kinds:
        behaviour = getattr(handler, attr)
        if behaviour is not None:
            return factory(
                wrap(behaviour, method, streams),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler


class _HandlerCache:
    """The wrapped handler of each method, built once instead of on every call.

    A method's handler object is the same on every call (the server's registry, or the
    next interceptor's cached one); a different object (a re-registered servicer) is
    wrapped anew.
    """

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def get(
        self,
        method: str,
        handler: grpc.RpcMethodHandler,
        build: Callable[[], grpc.RpcMethodHandler],
    ) -> grpc.RpcMethodHandler:
        entry = self._wrapped.get(method)
        if entry is not None and entry[0] is handler:
            return entry[1]
        wrapped = build()
        self._wrapped[method] = (handler, wrapped)
        return wrapped


class _WrappingInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self) -> None:
        self._handlers = _HandlerCache()

    def _wrap(self, behaviour: Behaviour, method: str, streams: bool) -> Behaviour:
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        return self._handlers.get(method, handler, lambda: _rewrap(handler, method, self._wrap))


async def relay(result: Any) -> AsyncIterator[Any]:
    """The responses of a response-streaming behaviour's `result`: the items of an async
    iterator, or none from a coroutine that sends with `context.write` (awaited)."""
    if hasattr(result, "__aiter__"):
        async for item in result:
            yield item
    else:
        await result


def _metadata_value(context: grpc.aio.ServicerContext, key: str) -> str | None:
    for k, v in context.invocation_metadata() or ():
        if k == key and isinstance(v, str):
            return v
    return None


class CorrelationIdInterceptor(_WrappingInterceptor):
    """Binds `x-correlation-id` (or a new one) for the call and echoes it to the caller.

    A response stream echoes it in its initial metadata (sent before the first message); a
    unary response in its trailing metadata, which grpc.aio sends in the same batch as the
    response and status (on errors too: `ErrorMappingInterceptor` keeps it), while an
    explicit initial-metadata send is a batch of its own (~0.1 ms per call on the lock
    hot path). A unary handler that sets trailing metadata must keep what is there.

    No `with`/reset: grpc.aio runs every RPC in a task of its own, whose context dies with
    it (see correlation.bind_for_call).
    """

    def _wrap(self, behaviour: Behaviour, method: str, streams: bool) -> Behaviour:
        if streams:

            async def stream_behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
                cid = correlation.bind_for_call(_metadata_value(context, correlation.METADATA_KEY))
                await context.send_initial_metadata(((correlation.METADATA_KEY, cid),))
                async for item in relay(behaviour(request, context)):
                    yield item

            return stream_behaviour

        async def unary_behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
            cid = correlation.bind_for_call(_metadata_value(context, correlation.METADATA_KEY))
            context.set_trailing_metadata(((correlation.METADATA_KEY, cid),))
            return await behaviour(request, context)

        return unary_behaviour


class AuthPrepareInterceptor(_WrappingInterceptor):
    """Before each RPC, lets the authenticator fetch what the call's token needs (JWKS
    keys for an unknown kid) off the event loop, so servicers identify callers without I/O."""

    def __init__(self, authenticator: Authenticator) -> None:
        super().__init__()
        self._auth = authenticator

    def _wrap(self, behaviour: Behaviour, method: str, streams: bool) -> Behaviour:
        if streams:

            async def stream_behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await self._auth.prepare(context)
                async for item in relay(behaviour(request, context)):
                    yield item

            return stream_behaviour

        async def unary_behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await self._auth.prepare(context)
            return await behaviour(request, context)

        return unary_behaviour


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


def _status_name(exc: BaseException) -> str:
    """The status code `_fail` answers `exc` with, as metrics and logs name it."""
    if isinstance(exc, NotImplementedError):
        return grpc.StatusCode.UNIMPLEMENTED.name
    exc = as_storage_full(exc) or exc
    if isinstance(exc, SerentakError):
        return exc.code.name
    return grpc.StatusCode.INTERNAL.name


_CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}


def _rpc_type(handler: grpc.RpcMethodHandler) -> str:
    """grpc_type as the conventional metrics name it."""
    if handler.request_streaming:
        return "bidi_stream" if handler.response_streaming else "client_stream"
    return "server_stream" if handler.response_streaming else "unary"


def _aborted_code(context: grpc.aio.ServicerContext) -> str:
    """The status a handler aborted with (context.abort sets it before raising)."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int):
        return _CODE_NAMES.get(code, "UNKNOWN")
    return "UNKNOWN"


class ErrorMappingInterceptor(_WrappingInterceptor):
    """Turns `SerentakError`s into their status and reason; anything else is a bug (INTERNAL).

    It also counts every call (grpc_server_started_total, grpc_server_handled_total with the
    final status code, grpc_server_handling_seconds) and logs `rpc_completed`.
    """

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        rpc_type = _rpc_type(handler)

        def wrap(behaviour: Behaviour, method: str, streams: bool) -> Behaviour:
            return self._wrap(behaviour, method, streams, rpc_type)

        method = handler_call_details.method
        return self._handlers.get(method, handler, lambda: _rewrap(handler, method, wrap))

    async def _fail(
        self,
        exc: BaseException,
        method: str,
        context: grpc.aio.ServicerContext,
        unary: bool = False,
    ) -> None:
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
        # A full disk (OSError, SQLite, PostgreSQL) is RESOURCE_EXHAUSTED, not a bug.
        exc = as_storage_full(exc) or exc
        if isinstance(exc, SerentakError):
            DOMAIN_ERRORS.labels(exc.reason).inc()
            log.info(
                "rpc_domain_error",
                method=method,
                code=exc.code.name,
                reason=exc.reason,
                error=exc.message,
            )
            await context.abort_with_status(_keeping_trailers(to_status(exc), context))
        log.error("rpc_bug", method=method, error=repr(exc), traceback=traceback.format_exc())
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")

    def _wrap(
        self, behaviour: Behaviour, method: str, streams: bool, rpc_type: str = "unary"
    ) -> Behaviour:
        labels = (*split_method(method), rpc_type)
        started_total = RPC_STARTED.labels(*labels)
        handling = RPC_HANDLING_SECONDS.labels(*labels)
        # Label children bound once per method (and code), not looked up on every call.
        handled = {"OK": RPC_HANDLED.labels(*labels, "OK")}

        def record(started: float, code: str, cid: str | None = None) -> None:
            elapsed = time.perf_counter() - started
            handling.observe(elapsed)
            counter = handled.get(code)
            if counter is None:
                counter = handled[code] = RPC_HANDLED.labels(*labels, code)
            counter.inc()
            # A stream closed by the loop's finalizer logs from another task: the call's
            # correlation id is passed explicitly so the line keeps it.
            extra = {"correlation_id": cid} if cid else {}
            log.info(
                "rpc_completed",
                method=method,
                code=code,
                duration_ms=round(elapsed * 1000, 3),
                **extra,
            )

        if streams:

            async def stream_behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
                started_total.inc()
                started, code, recorded = time.perf_counter(), "OK", False
                handler_done = False
                cid = correlation.current_correlation_id()

                def finish(code: str) -> None:
                    nonlocal recorded
                    if not recorded:
                        recorded = True
                        record(started, code, cid)

                def on_done(ctx: grpc.aio.ServicerContext) -> None:
                    # The call ended. While the handler still runs, the client went away: a
                    # generator suspended at its `yield` is only closed by the garbage
                    # collector, and `cancelled()` may not say so yet. A handler that returned
                    # because its request stream ended cannot tell a client's half-close from
                    # its cancel; the call's end can.
                    gone = not handler_done or ctx.cancelled()
                    finish(grpc.StatusCode.CANCELLED.name if gone else "OK")

                context.add_done_callback(on_done)
                try:
                    async for item in relay(behaviour(request, context)):
                        yield item
                except grpc.aio.AbortError:
                    code = _aborted_code(context)
                    raise
                except (GeneratorExit, asyncio.CancelledError):
                    code = grpc.StatusCode.CANCELLED.name
                    raise
                except Exception as exc:
                    code = _status_name(exc)
                    finish(code)  # before the status: abort sends it, then raises
                    await self._fail(exc, method, context)
                finally:
                    handler_done = True
                    if code != "OK":
                        finish(code)

            return stream_behaviour

        async def unary_behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started_total.inc()
            started, code, recorded = time.perf_counter(), "OK", False
            try:
                return await behaviour(request, context)
            except grpc.aio.AbortError:
                code = _aborted_code(context)
                raise
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED.name
                raise
            except Exception as exc:
                code = _status_name(exc)
                # Counted before the caller can see the status: abort sends it, then raises,
                # and the loop may run the rest much later (a scrape would miss the call).
                record(started, code)
                recorded = True
                await self._fail(exc, method, context, unary=True)
            finally:
                if not recorded:
                    record(started, code)

        return unary_behaviour
