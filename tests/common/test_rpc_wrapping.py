"""Every service's server runs with no interceptor (each handler was wrapped once, when it
was registered: rpc_registry.py), and what the interceptors gave every method is still
there for the services `start` adds itself: health and reflection answer with the call's
correlation id and are counted; a method nobody serves is UNIMPLEMENTED "Method not
found!" from grpc itself, with no metadata and no count, as it was with interceptors."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2 as pb
from prometheus_client import REGISTRY
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc
from support.services import lock_service_app, running_app

from services.common import correlation

KEY = correlation.METADATA_KEY
LOCKS = "serentak.locks.v1.LockService"


class Locks(locks_pb2_grpc.LockServiceServicer):
    async def Acquire(self, request, context):
        return locks_pb2.Lock(key=request.key, correlation_id=correlation.current_correlation_id())


def _started(service: str, method: str, grpc_type: str) -> float:
    labels = {"grpc_service": service, "grpc_method": method, "grpc_type": grpc_type}
    return REGISTRY.get_sample_value("grpc_server_started_total", labels) or 0.0


async def test_the_server_is_built_without_interceptors_and_still_wraps_every_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[dict[str, Any]] = []
    real_server = grpc.aio.server

    def recording_server(*args: Any, **kwargs: Any) -> grpc.aio.Server:
        built.append({"args": args, **kwargs})
        return real_server(*args, **kwargs)

    monkeypatch.setattr(grpc.aio, "server", recording_server)
    async with running_app(lock_service_app(Locks())) as svc:
        (call_args,) = built
        assert not call_args["args"] and not call_args.get("interceptors")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.app.bound_port}") as ch:
            before = _started(LOCKS, "Acquire", "unary")
            call = locks_pb2_grpc.LockServiceStub(ch).Acquire(
                locks_pb2.AcquireRequest(key="k"), metadata=((KEY, "wrap-1"),)
            )
            assert (await call).correlation_id == "wrap-1"
            assert dict(await call.trailing_metadata())[KEY] == "wrap-1"
            assert _started(LOCKS, "Acquire", "unary") == before + 1
            # A method the servicer base class leaves unimplemented: mapped, not a bug.
            release = locks_pb2_grpc.LockServiceStub(ch).Release(
                locks_pb2.ReleaseRequest(), metadata=((KEY, "wrap-2"),)
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await release
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert "not implemented yet" in (err.value.details() or "")
            assert dict(err.value.initial_metadata())[KEY] == "wrap-2"
            assert dict(err.value.trailing_metadata())[KEY] == "wrap-2"


async def test_health_and_reflection_are_wrapped_and_unknown_methods_unimplemented() -> None:
    async with running_app(lock_service_app(Locks())) as svc:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.app.bound_port}") as ch:
            health = health_pb2_grpc.HealthStub(ch)
            before = _started("grpc.health.v1.Health", "Check", "unary")
            check = health.Check(health_pb2.HealthCheckRequest(), metadata=((KEY, "h-1"),))
            assert (await check).status == health_pb2.HealthCheckResponse.SERVING
            assert dict(await check.trailing_metadata())[KEY] == "h-1"
            assert _started("grpc.health.v1.Health", "Check", "unary") == before + 1

            watch = health.Watch(health_pb2.HealthCheckRequest(), metadata=((KEY, "h-2"),))
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            assert dict(await watch.initial_metadata())[KEY] == "h-2"
            watch.cancel()

            for version in ("v1", "v1alpha"):
                reflect = ch.stream_stream(
                    f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
                    request_serializer=pb.ServerReflectionRequest.SerializeToString,
                    response_deserializer=pb.ServerReflectionResponse.FromString,
                )(metadata=((KEY, f"r-{version}"),))
                await reflect.write(pb.ServerReflectionRequest(list_services=""))
                reply = await reflect.read()
                await reflect.done_writing()
                listed = {s.name for s in reply.list_services_response.service}
                assert LOCKS in listed and "grpc.health.v1.Health" in listed
                assert dict(await reflect.initial_metadata())[KEY] == f"r-{version}"

            for method in (f"/{LOCKS}/NoSuchMethod", "/no.such.Service/Method"):
                service, name = method.lstrip("/").split("/")
                unknown = ch.unary_unary(method)(b"", metadata=((KEY, "u-1"),))
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await unknown
                assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
                assert err.value.details() == "Method not found!"
                assert KEY not in dict(err.value.initial_metadata() or ())
                assert KEY not in dict(err.value.trailing_metadata() or ())
                assert _started(service, name, "unary") == 0
