"""Registration that wraps every method handler once, before the server sees it.

Pass a `WrappingRegistry` where the generated `add_XServicer_to_server(servicer, server)`
functions (and grpc_health's) expect the server: grpcio 1.85's generated code calls
`add_generic_rpc_handlers` and `add_registered_method_handlers` (the registered handler
takes precedence), and both get each method's handler wrapped (rpc_wrapper.py). The
server itself then has no interceptors. A method no handler serves is answered by grpc
itself, as it was with interceptors: UNIMPLEMENTED "Method not found!", no metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import grpc

from services.common.auth import Authenticator
from services.common.call_capacity import CallCapacity, CapacityGate
from services.common.rate_limits.gate import RateGate
from services.common.rpc_wrapper import wrap_handler


class Registrar(Protocol):
    """Where handlers are registered: a grpc.aio.Server, or a `WrappingRegistry` on one."""

    def add_generic_rpc_handlers(
        self, generic_rpc_handlers: Sequence[grpc.GenericRpcHandler]
    ) -> None: ...

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None: ...


class WrappingRegistry:
    """Stands in for `server` at registration; hands it the wrapped handlers."""

    def __init__(
        self,
        server: grpc.aio.Server,
        authenticator: Authenticator | None,
        capacity: CallCapacity | None = None,
        rates: RateGate | None = None,
    ) -> None:
        self._server = server
        # Each method's rate limit, when the service has limits (rate_limits/).
        self._rates = rates
        self._prepare = authenticator.prepare if authenticator is not None else None
        # Every method of the server admits its calls through one gate, when it has one.
        self._gate = CapacityGate(capacity, authenticator) if capacity is not None else None
        # Per full method name: the handler as registered and its wrapped one, so the
        # generic and the registered registration of the same handler share one wrapper.
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def wrapped(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """`handler` for full method name `method`, wrapped (once per handler object)."""
        entry = self._wrapped.get(method)
        if entry is not None and entry[0] is handler:
            return entry[1]
        rate = self._rates.for_method(method) if self._rates is not None else None
        wrapped = wrap_handler(handler, method, self._prepare, self._gate, rate)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        """Register `method_handlers` (by method name) of `service_name`, wrapped."""
        self._server.add_registered_method_handlers(
            service_name,
            {
                name: self.wrapped(f"/{service_name}/{name}", handler)
                for name, handler in method_handlers.items()
            },
        )

    def add_generic_rpc_handlers(
        self, generic_rpc_handlers: Sequence[grpc.GenericRpcHandler]
    ) -> None:
        """Register generic handlers whose handlers are wrapped when first looked up."""
        self._server.add_generic_rpc_handlers(
            [_WrappedGenericHandler(h, self) for h in generic_rpc_handlers]
        )


class _WrappedGenericHandler(grpc.GenericRpcHandler):
    """A generic handler's lookups, wrapped. grpc asks generic handlers only for methods
    not registered with `add_registered_method_handlers` (the generated code registers
    every method both ways), and a generic handler lists no methods up front."""

    def __init__(self, inner: grpc.GenericRpcHandler, registry: WrappingRegistry) -> None:
        self._inner = inner
        self._registry = registry

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        return self._registry.wrapped(handler_call_details.method, handler)
