"""What every RPC runs around its servicer method, composed into one behaviour per method.

In this order, inside the RPC's own task (where context variables, the correlation id and
structlog's bound keys, belong to that call only):
1. the correlation id: `x-correlation-id` (or a new one) bound for the call and echoed,
   and recorded on the call's span when tracing is on (tracing.py);
2. auth prepare (when an authenticator is configured): the authenticator fetches what the
   call's token needs (JWKS keys for an unknown kid) off the event loop, so servicers
   identify callers without I/O;
3. error mapping and accounting: typed errors become their status and reason (anything
   else is INTERNAL, rpc_status.py), and every call is counted and logged
   (rpc_accounting.py). Errors of steps 1-2 are not mapped or counted;
4. capacity (when the server has a gate): the call takes a slot of its caller's pool
   before its handler runs, or is refused RESOURCE_EXHAUSTED (mapped and counted as in
   step 3), and gives it back when the call ends (call_capacity.py);
5. rate (when the method has a limit): the call spends a unit of its user's and tenant's
   windows before its handler runs, and so does each later message of a stream whose
   rule counts messages, or it is refused RESOURCE_EXHAUSTED / RATE_LIMITED with a
   RetryInfo (rate_limits/).

Built once per method when the servicer is registered (rpc_registry.py), so the server
runs without interceptors: grpc.aio then awaits no interceptor chain per call, and a call
runs one coroutine (unary response) or one async generator (response stream) around the
servicer's method instead of one per concern.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from services.common import correlation, tracing
from services.common.call_capacity import CapacityGate, Slot
from services.common.rate_limits.gate import MethodRate
from services.common.rpc_accounting import MethodAccounting, rpc_type
from services.common.rpc_status import aborted_code, fail, status_name

Behaviour = Callable[..., Any]
# Authenticator.prepare, bound: awaited before each call's handler.
Prepare = Callable[[grpc.aio.ServicerContext], Awaitable[None]]

_CANCELLED = grpc.StatusCode.CANCELLED.name
# (attribute, handler factory, responses stream, requests stream)
_KINDS = (
    ("unary_unary", grpc.unary_unary_rpc_method_handler, False, False),
    ("unary_stream", grpc.unary_stream_rpc_method_handler, True, False),
    ("stream_unary", grpc.stream_unary_rpc_method_handler, False, True),
    ("stream_stream", grpc.stream_stream_rpc_method_handler, True, True),
)


def wrap_handler(
    handler: grpc.RpcMethodHandler,
    method: str,
    prepare: Prepare | None,
    gate: CapacityGate | None = None,
    rate: MethodRate | None = None,
) -> grpc.RpcMethodHandler:
    """`handler` (of full method name `method`) with its behaviour wrapped, keeping its
    (de)serializers; `gate`: the server's capacity gate, if it has one; `rate`: the
    method's rate limit, if it has one."""
    accounting = MethodAccounting(method, rpc_type(handler))
    for attr, factory, streams, requests in _KINDS:
        behaviour = getattr(handler, attr)
        if behaviour is not None:
            wrap = _wrap_stream if streams else _wrap_unary
            return factory(
                wrap(behaviour, accounting, prepare, gate, _Rate.of(rate, requests, streams)),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler


def _metadata_value(context: grpc.aio.ServicerContext, key: str) -> str | None:
    for k, v in context.invocation_metadata() or ():
        if k == key and isinstance(v, str):
            return v
    return None


class _Rate:
    """A method's limit as its wrapper applies it: which of its streams count messages."""

    __slots__ = ("count_requests", "count_responses", "method")

    def __init__(self, method: MethodRate, requests: bool, responses: bool) -> None:
        self.method = method
        self.count_requests = requests and method.messages
        self.count_responses = responses and method.messages and not requests

    @classmethod
    def of(cls, method: MethodRate | None, requests: bool, responses: bool) -> _Rate | None:
        return cls(method, requests, responses) if method is not None else None

    async def admit(self, request: Any, context: grpc.aio.ServicerContext) -> tuple[Any, Any]:
        """Spend the call's unit; (the request or a counting request stream, the caller)."""
        caller = self.method.caller(context)
        if caller is None:
            return request, None
        await self.method.take(caller)
        if self.count_requests:
            request = self.method.requests(request, caller)
        return request, caller


def _wrap_unary(
    behaviour: Behaviour,
    accounting: MethodAccounting,
    prepare: Prepare | None,
    gate: CapacityGate | None,
    rate: _Rate | None,
) -> Behaviour:
    """One response (unary or client stream)."""
    method, record, started_total = accounting.method, accounting.record, accounting.started_total

    async def unary_behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
        # The id goes back in the trailing metadata, which grpc.aio sends in the same batch
        # as the response and status (on errors too: rpc_status keeps it), while an
        # explicit initial-metadata send is a batch of its own (~0.1 ms per call on the
        # lock hot path). A handler that sets trailing metadata must keep what is there.
        # No reset: grpc.aio runs every RPC in a task of its own, whose context dies with
        # it (see correlation.bind_for_call).
        cid = correlation.bind_for_call(_metadata_value(context, correlation.METADATA_KEY))
        context.set_trailing_metadata(((correlation.METADATA_KEY, cid),))
        tracing.note_correlation_id(cid)
        if prepare is not None:
            await prepare(context)
        started_total.inc()
        started, code, recorded = time.perf_counter(), "OK", False
        slot: Slot | None = None
        try:
            if gate is not None:
                slot = gate.admit(context, stream=False)
            if rate is not None:
                request, _ = await rate.admit(request, context)
            return await behaviour(request, context)
        except grpc.aio.AbortError:
            code = aborted_code(context)
            raise
        except asyncio.CancelledError:
            code = _CANCELLED
            raise
        except Exception as exc:
            code = status_name(exc)
            # Counted before the caller can see the status: abort sends it, then raises,
            # and the loop may run the rest much later (a scrape would miss the call).
            record(started, code)
            recorded = True
            await fail(exc, method, context, unary=True)
        finally:
            if slot is not None:
                slot.release()
            if not recorded:
                record(started, code)

    return unary_behaviour


def _wrap_stream(
    behaviour: Behaviour,
    accounting: MethodAccounting,
    prepare: Prepare | None,
    gate: CapacityGate | None,
    rate: _Rate | None,
) -> Behaviour:
    """A response stream: the behaviour is an async iterator of responses, or a coroutine
    that sends them with `context.write` (awaited)."""
    method, record, started_total = accounting.method, accounting.record, accounting.started_total

    async def stream_behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
        # A stream echoes the id in its initial metadata, sent before the first message.
        cid = correlation.bind_for_call(_metadata_value(context, correlation.METADATA_KEY))
        await context.send_initial_metadata(((correlation.METADATA_KEY, cid),))
        tracing.note_correlation_id(cid)
        if prepare is not None:
            await prepare(context)
        started_total.inc()
        started, code, recorded = time.perf_counter(), "OK", False
        handler_done = False
        slot: Slot | None = None

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
            finish(_CANCELLED if gone else "OK")
            # Also here: a generator left suspended by a client that went away is only
            # closed (its `finally` run) by the garbage collector.
            if slot is not None:
                slot.release()

        context.add_done_callback(on_done)
        try:
            if gate is not None:
                slot = gate.admit(context, stream=True)
            caller = None
            if rate is not None:
                request, caller = await rate.admit(request, context)
            result = behaviour(request, context)
            if caller is not None and rate is not None and rate.count_responses:
                result = rate.method.responses(result, caller)
            if hasattr(result, "__aiter__"):
                async for item in result:
                    yield item
            else:
                await result
        except grpc.aio.AbortError:
            code = aborted_code(context)
            raise
        except (GeneratorExit, asyncio.CancelledError):
            code = _CANCELLED
            raise
        except Exception as exc:
            code = status_name(exc)
            finish(code)  # before the status: abort sends it, then raises
            await fail(exc, method, context)
        finally:
            handler_done = True
            if slot is not None:
                slot.release()
            if code != "OK":
                finish(code)

    return stream_behaviour
