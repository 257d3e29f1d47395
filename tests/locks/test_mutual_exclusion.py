"""Mutual exclusion and FIFO order, racing the real service and etcd."""

from __future__ import annotations

import asyncio

import pytest
from locks.lock_assertions import wait_for_waiters
from locks.principals import USER_TOKEN
from serentak.locks.v1 import locks_pb2
from serentak.sdk.locks import LockClient

pytestmark = pytest.mark.etcd

CONTENDERS = 50
ROUNDS = 4


async def test_fifty_contenders_increment_a_shared_counter_exactly(lock_service) -> None:  # type: ignore[no-untyped-def]
    counter = 0
    inside = 0
    tokens: list[int] = []
    clients = [
        LockClient(lock_service.address, owner=f"worker-{i}", token=USER_TOKEN)
        for i in range(CONTENDERS)
    ]

    async def contender(client: LockClient) -> None:
        nonlocal counter, inside
        for _ in range(ROUNDS):
            lock = await client.acquire("user:alice:counter", ttl=30, wait_timeout=120)
            inside += 1
            assert inside == 1, "two holders at once"
            tokens.append(lock.token)
            seen = counter
            await asyncio.sleep(0)  # a read-await-write race if exclusion ever fails
            counter = seen + 1
            inside -= 1
            assert await client.release("user:alice:counter", lock.token)

    try:
        await asyncio.wait_for(asyncio.gather(*(contender(c) for c in clients)), 240)
    finally:
        for c in clients:
            await c.close()
    assert counter == CONTENDERS * ROUNDS
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    state = await lock_service.stub.Describe(locks_pb2.DescribeRequest(key="user:alice:counter"))
    assert not state.held and list(state.waiters) == []


async def test_waiters_are_served_first_come_first_served(lock_service) -> None:  # type: ignore[no-untyped-def]
    stub = lock_service.stub
    client = LockClient(lock_service.address, owner="fifo", token=USER_TOKEN)
    try:
        for round_no in range(3):
            key = f"user:alice:fifo{round_no}"
            first = await stub.Acquire(
                locks_pb2.AcquireRequest(key=key, owner="first", ttl_seconds=30)
            )
            served: list[int] = []

            async def waiter(i: int, key: str = key, served: list[int] = served) -> None:
                lock = await client.acquire(key, ttl=30, wait_timeout=60)
                served.append(i)
                await client.release(key, lock.token)

            tasks = []
            for i in range(10):
                tasks.append(asyncio.create_task(waiter(i)))
                # Queue them one by one: the next starts only once this one is queued.
                await wait_for_waiters(stub, key, i + 1)
            await stub.Release(locks_pb2.ReleaseRequest(key=key, token=first.token))
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
            assert served == list(range(10))
    finally:
        await client.close()
