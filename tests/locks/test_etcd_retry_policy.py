"""Which etcd call failures move to the next member: the member or the connection failed,
never the request itself."""

from __future__ import annotations

import grpc
from grpc.aio import AioRpcError, Metadata

from services.locks.etcd_connection import retryable


def _error(code: grpc.StatusCode, details: str) -> AioRpcError:
    return AioRpcError(code, Metadata(), Metadata(), details=details)


def test_a_connection_broken_under_a_send_is_retried_on_another_member() -> None:
    # What grpc core raises on a keep-alive stream whose member was SIGKILLed.
    assert retryable(_error(grpc.StatusCode.INTERNAL, "Internal error from Core"))


def test_unavailable_and_unknown_members_are_retried() -> None:
    assert retryable(_error(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    assert retryable(_error(grpc.StatusCode.UNKNOWN, "etcdserver: leader changed"))


def test_an_internal_error_etcd_itself_answered_is_not_retried() -> None:
    assert not retryable(_error(grpc.StatusCode.INTERNAL, "etcdserver: corrupt cluster"))
    assert not retryable(_error(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: bad key"))
