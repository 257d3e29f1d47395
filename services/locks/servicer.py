"""gRPC surface of `serentak.locks.v1.LockService`."""

from __future__ import annotations

from serentak.locks.v1 import locks_pb2_grpc


class LockServicer(locks_pb2_grpc.LockServiceServicer):
    """Every RPC answers UNIMPLEMENTED until the lock service is built."""
