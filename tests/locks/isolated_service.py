"""A lock service of a test's own: in-process, under a fresh key prefix of the shared etcd."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import grpc
from serentak.locks.v1 import locks_pb2_grpc
from support.etcd import EtcdServer
from support.services import running_app

from services.locks.app import build_app
from services.locks.settings import LocksSettings


@contextlib.asynccontextmanager
async def locks_service(
    etcd: EtcdServer, **overrides: object
) -> AsyncIterator[tuple[locks_pb2_grpc.LockServiceStub, str, grpc.aio.Channel]]:
    """The lock service under a fresh prefix (settings `overrides`); a stub that sends no
    credential by itself, the prefix, and the stub's channel."""
    prefix = f"/t/{uuid.uuid4().hex}/"
    settings = LocksSettings(etcd_endpoint=etcd.endpoint, lock_prefix=prefix, **overrides)
    async with running_app(build_app(settings)) as svc:
        address = f"127.0.0.1:{svc.app.bound_port}"
        async with grpc.aio.insecure_channel(address) as channel:
            yield locks_pb2_grpc.LockServiceStub(channel), prefix, channel
