"""Hold and Session streams end every task they start, on every exit path (issue #34: "Task
was destroyed but it is pending!" 129 times in 272 Hold streams). Many cycles of each way a
stream ends — the client half-closes, the client cancels mid-hold, the lock is lost, the
token is wrong, a Session is cancelled mid-Acquire — against the lock service in this event
loop on a real etcd; every complaint asyncio raises (a pending task destroyed, an exception
never retrieved) is collected by the loop's exception handler, during the run and after a
garbage collection at the end: none."""

from __future__ import annotations

import asyncio
import gc
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from locks.lock_assertions import wait_for_waiters
from locks.principals import USER_TOKEN, bearer
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc
from support.etcd import EtcdServer
from support.services import running_app

from services.locks.app import build_app
from services.locks.settings import LocksSettings

pytestmark = pytest.mark.etcd

CYCLES = 25
# Per call, not by an intercepting channel: grpc.aio runs an intercepted stream's writes
# through a request iterator task of its own, which the client would leave pending.
MD = bearer(USER_TOKEN)


async def _hold(stub: locks_pb2_grpc.LockServiceStub, key: str) -> tuple[Any, locks_pb2.Lock]:
    lock = await stub.Acquire(
        locks_pb2.AcquireRequest(key=key, owner="o", ttl_seconds=10), metadata=MD
    )
    call = stub.Hold(metadata=MD)
    await call.write(locks_pb2.HoldRequest(key=key, token=lock.token))
    assert (await call.read()).held.token == lock.token
    return call, lock


async def _read_to_end(call: Any) -> list[locks_pb2.HoldEvent]:
    events = []
    async with asyncio.timeout(30):
        while (event := await call.read()) is not grpc.aio.EOF:
            events.append(event)
    return events


async def half_close(stub: locks_pb2_grpc.LockServiceStub, key: str) -> None:
    call, lock = await _hold(stub, key)
    await call.done_writing()
    await _read_to_end(call)
    assert await call.code() == grpc.StatusCode.OK
    await stub.Release(locks_pb2.ReleaseRequest(key=key, token=lock.token), metadata=MD)


async def cancel_mid_hold(stub: locks_pb2_grpc.LockServiceStub, key: str) -> None:
    call, lock = await _hold(stub, key)
    call.cancel()
    await stub.Release(locks_pb2.ReleaseRequest(key=key, token=lock.token), metadata=MD)


async def lock_lost(stub: locks_pb2_grpc.LockServiceStub, key: str) -> None:
    call, lock = await _hold(stub, key)
    await stub.Release(locks_pb2.ReleaseRequest(key=key, token=lock.token), metadata=MD)
    events = await _read_to_end(call)
    assert events[-1].lost.reason == locks_pb2.LOST_REASON_KEY_DELETED


async def wrong_token(stub: locks_pb2_grpc.LockServiceStub, key: str) -> None:
    lock = await stub.Acquire(
        locks_pb2.AcquireRequest(key=key, owner="o", ttl_seconds=10), metadata=MD
    )
    call = stub.Hold(metadata=MD)
    await call.write(locks_pb2.HoldRequest(key=key, token=lock.token + 1))
    events = await _read_to_end(call)
    assert [e.lost.reason for e in events] == [locks_pb2.LOST_REASON_NOT_HOLDER]
    await stub.Release(locks_pb2.ReleaseRequest(key=key, token=lock.token), metadata=MD)


async def session_cancelled_mid_acquire(stub: locks_pb2_grpc.LockServiceStub, key: str) -> None:
    lock = await stub.Acquire(
        locks_pb2.AcquireRequest(key=key, owner="o", ttl_seconds=10), metadata=MD
    )
    call = stub.Session(metadata=MD)
    await call.write(
        locks_pb2.SessionRequest(
            id=1,
            acquire=locks_pb2.AcquireRequest(
                key=key, owner="w", ttl_seconds=10, wait_timeout_ms=30_000
            ),
        )
    )
    await wait_for_waiters(stub, key, 1, metadata=MD)  # the session's Acquire is waiting in etcd
    call.cancel()
    await stub.Release(locks_pb2.ReleaseRequest(key=key, token=lock.token), metadata=MD)


async def session_closed(stub: locks_pb2_grpc.LockServiceStub, key: str) -> None:
    call = stub.Session(metadata=MD)
    await call.write(
        locks_pb2.SessionRequest(
            id=1, acquire=locks_pb2.AcquireRequest(key=key, owner="s", ttl_seconds=10)
        )
    )
    acquired = await call.read()
    await call.write(
        locks_pb2.SessionRequest(
            id=2, release=locks_pb2.ReleaseRequest(key=key, token=acquired.lock.token)
        )
    )
    assert (await call.read()).release.released
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF


ENDINGS: list[Callable[[locks_pb2_grpc.LockServiceStub, str], Awaitable[None]]] = [
    half_close,
    cancel_mid_hold,
    lock_lost,
    wrong_token,
    session_cancelled_mid_acquire,
    session_closed,
]


async def test_streams_leave_no_task_behind(etcd: EtcdServer, caplog) -> None:  # type: ignore[no-untyped-def]
    complaints: list[str] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(
        lambda _loop, ctx: complaints.append(f"{ctx['message']} {ctx.get('task')!r:.300}")
    )
    caplog.set_level(logging.ERROR, logger="asyncio")
    settings = LocksSettings(etcd_endpoint=etcd.endpoint, lock_prefix=f"/t/{uuid.uuid4().hex}/")
    try:
        async with running_app(build_app(settings)) as svc:
            address = f"127.0.0.1:{svc.app.bound_port}"
            async with grpc.aio.insecure_channel(address) as channel:
                stub = locks_pb2_grpc.LockServiceStub(channel)
                for cycle in range(CYCLES):
                    await asyncio.gather(
                        *(
                            ending(stub, f"user:alice:{ending.__name__}-{cycle}")
                            for ending in ENDINGS
                        )
                    )
                    gc.collect()  # a task orphaned by a finished stream is destroyed now
        gc.collect()
    finally:
        loop.set_exception_handler(None)
    asyncio_errors = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert complaints == [] and asyncio_errors == [], (complaints[:5], asyncio_errors[:5])
