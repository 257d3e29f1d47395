"""A test channel that sends a bearer credential with every call (like a real client)."""

from __future__ import annotations

from typing import Any

import grpc


def _with_token(details: Any, pair: tuple[str, str]) -> Any:
    metadata = list(details.metadata or ())
    if not any(key == "authorization" for key, _ in metadata):
        metadata.append(pair)
    return details._replace(metadata=grpc.aio.Metadata(*metadata))


# grpc.aio files an interceptor under its first matching kind only: one class per kind.
class _UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, pair: tuple[str, str]) -> None:
        self.pair = pair

    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(_with_token(details, self.pair), request)


class _UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, pair: tuple[str, str]) -> None:
        self.pair = pair

    async def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(_with_token(details, self.pair), request)


class _StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
    def __init__(self, pair: tuple[str, str]) -> None:
        self.pair = pair

    async def intercept_stream_unary(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        return await continuation(_with_token(details, self.pair), request_iterator)


class _StreamStream(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self, pair: tuple[str, str]) -> None:
        self.pair = pair

    async def intercept_stream_stream(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        return await continuation(_with_token(details, self.pair), request_iterator)


def bearer_channel(address: str, token: str) -> grpc.aio.Channel:
    """An insecure channel to `address` whose calls carry `token` unless they name one."""
    pair = ("authorization", f"Bearer {token}")
    kinds = (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)
    return grpc.aio.insecure_channel(address, interceptors=[kind(pair) for kind in kinds])
