"""gRPC surface of `serentak.notify.v1.NotifyService`."""

from __future__ import annotations

from serentak.notify.v1 import notify_pb2_grpc


class NotifyServicer(notify_pb2_grpc.NotifyServiceServicer):
    """Every RPC answers UNIMPLEMENTED until notifications are built."""
