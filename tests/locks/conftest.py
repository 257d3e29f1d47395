"""Fixtures for the lock service tests: the service in-process on the session etcd."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from locks.principals import USER_TOKEN
from serentak.locks.v1 import locks_pb2_grpc
from support.bearer import bearer_channel
from support.etcd import EtcdServer
from support.services import running_app

from services.locks.app import build_app
from services.locks.etcd_client import Etcd
from services.locks.settings import LocksSettings


@dataclass
class LockService:
    """A running lock service, a stub to it, and a direct etcd client for checks."""

    address: str
    stub: locks_pb2_grpc.LockServiceStub
    etcd: Etcd
    prefix: str


@pytest.fixture
async def lock_service(etcd: EtcdServer) -> AsyncIterator[LockService]:
    """The lock service on the shared etcd, under a key prefix of its own."""
    prefix = f"/t/{uuid.uuid4().hex}/"
    settings = LocksSettings(etcd_endpoint=etcd.endpoint, lock_prefix=prefix)
    async with running_app(build_app(settings)) as svc:
        address = f"127.0.0.1:{svc.app.bound_port}"
        # The stub acts as alice (tenant acme), like a signed-in user's client.
        async with bearer_channel(address, USER_TOKEN) as channel:
            direct = Etcd(etcd.endpoint, call_timeout=5)
            try:
                yield LockService(address, locks_pb2_grpc.LockServiceStub(channel), direct, prefix)
            finally:
                await direct.close()
