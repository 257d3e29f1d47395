"""The etcd client against a 3-member cluster over TLS with client certificates and auth.

Certificates are made at test time (trustme); the cluster is three /usr/bin/etcd
processes on loopback (`support.etcd.EtcdCluster`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections import defaultdict

import grpc
import pytest
from etcd3aio._protobuf import rpc_pb2, rpc_pb2_grpc
from prometheus_client import REGISTRY
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc
from serentak.sdk.locks import LockClient
from support.etcd import EtcdCluster
from support.services import running_app

from services.locks.app import build_app
from services.locks.errors import EtcdAuthFailed, EtcdPermissionDenied, EtcdUnavailable
from services.locks.etcd_client import Etcd
from services.locks.etcd_connection import EtcdOptions, options_from_settings
from services.locks.settings import LocksSettings

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

USER = (("authorization", "Bearer dev-alice"),)
HELD_TTL_S = 10


def options(cluster: EtcdCluster, **changes: object) -> EtcdOptions:
    """Client options for the cluster (TLS, client certificate, auth), with changes."""
    base = options_from_settings(LocksSettings(**cluster.settings()), call_timeout=5)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


async def test_put_and_read_through_tls_auth_and_dns_names(etcd_cluster: EtcdCluster) -> None:
    # One member by DNS name (its certificate names localhost), the others by IP.
    port0 = etcd_cluster.endpoints[0].rsplit(":", 1)[1]
    endpoints = (f"localhost:{port0}", *etcd_cluster.endpoints[1:])
    etcd = Etcd(options(etcd_cluster, endpoints=endpoints))
    try:
        lease = await etcd.grant_lease(5)
        claim = await etcd.claim(b"/x/a/1", b"v", lease, b"/x/a/")
        assert claim.holder is not None and claim.holder.create_revision == claim.my_revision
        assert await etcd.keep_alive(lease) > 0
        assert etcd.connection.authentications == 1
    finally:
        await etcd.close()


async def test_untrusted_or_missing_credentials_are_refused(etcd_cluster: EtcdCluster) -> None:
    certs = etcd_cluster.certs
    assert certs is not None
    cases = {
        "plaintext": options(etcd_cluster, ca_file=None, cert_file=None, key_file=None),
        "no client certificate": options(etcd_cluster, cert_file=None, key_file=None),
        "client certificate of another CA": options(
            etcd_cluster, cert_file=certs.foreign_cert_file, key_file=certs.foreign_key_file
        ),
    }
    for name, opts in cases.items():
        etcd = Etcd(dataclasses.replace(opts, call_timeout=1.5))
        try:
            with pytest.raises(EtcdUnavailable):
                await etcd.grant_lease(5)
        finally:
            await etcd.close()
        assert name  # each case refused
    wrong = Etcd(options(etcd_cluster, password="not-the-password"))
    try:
        with pytest.raises(EtcdAuthFailed):
            await wrong.grant_lease(5)
    finally:
        await wrong.close()
    # Without a token etcd takes the certificate's name as the user: not one it knows.
    anonymous = Etcd(options(etcd_cluster, username=None, password=None))
    try:
        with pytest.raises(EtcdPermissionDenied):
            await anonymous.claim(b"/x/b/1", b"v", 0, b"/x/b/")
    finally:
        await anonymous.close()


async def test_token_is_refreshed_when_etcd_stops_accepting_it(etcd_cluster: EtcdCluster) -> None:
    etcd = Etcd(options(etcd_cluster))
    try:
        await etcd.first_created(b"/x/c/")
        assert etcd.connection.authentications == 1

        # Setting the password (to the same one) makes etcd drop the user's tokens.
        def set_password(channel: grpc.Channel, md: tuple[tuple[str, str], ...]) -> None:
            request = rpc_pb2.AuthUserChangePasswordRequest(
                name=etcd_cluster.username, password=etcd_cluster.password
            )
            rpc_pb2_grpc.AuthStub(channel).UserChangePassword(request, metadata=md, timeout=5)

        etcd_cluster.admin(set_password)
        assert await etcd.first_created(b"/x/c/") is None
        assert etcd.connection.authentications == 2
    finally:
        await etcd.close()


async def test_a_hung_member_is_left_for_another_within_the_call_timeout(
    etcd_cluster: EtcdCluster,
) -> None:
    """A member that stops answering (SIGSTOP: no RST, no error) costs one attempt's share."""
    leader = etcd_cluster.leader()
    follower = (leader + 1) % 3
    endpoints = etcd_cluster.endpoints
    ordered = (endpoints[follower], *(e for i, e in enumerate(endpoints) if i != follower))
    etcd = Etcd(options(etcd_cluster, endpoints=ordered, prefer_first=True, call_timeout=5))
    try:
        await etcd.first_created(b"/x/h/")  # connected and authenticated on the follower
        etcd_cluster.pause(follower)
        started = time.monotonic()
        lease = await etcd.grant_lease(5)
        claim = await etcd.claim(b"/x/h/1", b"v", lease, b"/x/h/")
        elapsed = time.monotonic() - started
        assert claim.holder is not None and claim.holder.create_revision == claim.my_revision
        assert etcd.connection.current_endpoint != endpoints[follower]
        assert elapsed < 5, elapsed
    finally:
        etcd_cluster.resume(follower)
        await etcd.close()


async def test_a_watch_follows_the_cluster_through_member_after_member_dying(
    etcd_cluster: EtcdCluster,
) -> None:
    """A waiter's watch re-opens on a live member each time its member dies, from the same
    revision: the deletion made while it moved is still delivered."""
    watcher = Etcd(options(etcd_cluster, prefer_first=True, call_timeout=3))
    writer = Etcd(options(etcd_cluster))
    try:
        lease = await writer.grant_lease(30)
        claim = await writer.claim(b"/x/w/1", b"v", lease, b"/x/w/")
        waiting = asyncio.create_task(watcher.wait_deleted([b"/x/w/1"], claim.revision + 1))
        for member in (0, 1):
            await asyncio.to_thread(etcd_cluster.kill, member)
            await asyncio.to_thread(etcd_cluster.leader)  # the survivors have a leader
            # Longer than the watcher's call timeout: each break is a fresh failure.
            await asyncio.sleep(3.5)
            assert not waiting.done()
            await asyncio.to_thread(etcd_cluster.start, member)
        assert await writer.delete_if_created_at(b"/x/w/1", claim.my_revision)
        deleted, revision = await asyncio.wait_for(waiting, 10)
        assert deleted.key == b"/x/w/1" and revision > claim.revision
    finally:
        await watcher.close()
        await writer.close()


async def test_locks_keep_working_when_the_leader_dies(etcd_cluster: EtcdCluster) -> None:
    """Contending workers through the lock service; SIGKILL the leader mid-run.

    Every Acquire/Release keeps succeeding (the client fails over to the survivors) and
    the fencing tokens of each key strictly increase across the leader change.
    """
    # The service starts on the leader, so killing it forces a failover.
    leader = etcd_cluster.leader()
    endpoints = etcd_cluster.endpoints
    ordered = [endpoints[leader]] + [e for i, e in enumerate(endpoints) if i != leader]
    settings = LocksSettings(
        **(etcd_cluster.settings() | {"etcd_endpoints": ",".join(ordered)}),
        etcd_prefer_first_endpoint=True,
        lock_prefix="/cluster-test/",
    )
    failovers_before = REGISTRY.get_sample_value("serentak_etcd_failovers_total") or 0.0
    tokens: dict[str, list[int]] = defaultdict(list)
    killed = asyncio.Event()
    progressed = asyncio.Event()
    after_kill = 0
    victim = -1
    async with running_app(build_app(settings)) as svc:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.app.bound_port}") as channel:
            stub = locks_pb2_grpc.LockServiceStub(channel)

            async def worker(i: int) -> None:
                nonlocal after_kill
                key = f"user:alice:k{i % 2}"
                for _ in range(60):
                    lock = await stub.Acquire(
                        locks_pb2.AcquireRequest(
                            key=key, owner=f"w{i}", ttl_seconds=10, wait_timeout_ms=20_000
                        ),
                        metadata=USER,
                    )
                    # Inside the critical section: the order of this list is the order
                    # of holders of `key`.
                    tokens[key].append(lock.token)
                    if sum(map(len, tokens.values())) >= 40:
                        progressed.set()
                    if killed.is_set():
                        after_kill += 1
                    released = await stub.Release(
                        locks_pb2.ReleaseRequest(key=key, token=lock.token), metadata=USER
                    )
                    assert released.released

            async def kill_leader() -> None:
                nonlocal victim
                await progressed.wait()
                # Normally still the member the service uses; on a starved machine an
                # election may have moved leadership meanwhile: kill the leader anyway.
                victim = await asyncio.to_thread(etcd_cluster.leader)
                await asyncio.to_thread(etcd_cluster.kill, victim)
                killed.set()

            # A lock held through the kill: its lease keeps being renewed by the
            # survivors (Hold's keepalive fails over) and it is never reported lost.
            # Its TTL is the workers' 10 s: the leader's death costs an election plus the
            # failover of each call, which took over 5 s on a loaded 2-core run; a TTL
            # shorter than that is lost by design, whatever the client does.
            holder = LockClient(channel, owner="long-job", token="dev-alice")
            async with holder.hold("user:alice:held", ttl=HELD_TTL_S) as held:
                await asyncio.gather(kill_leader(), *(worker(i) for i in range(4)))
                killed_at = time.time()
                async with asyncio.timeout(3 * HELD_TTL_S):
                    while True:  # observing a renewal made after the workers finished, bounded
                        renewed_until = held.lock.expires_at.ToMilliseconds() / 1000
                        if renewed_until >= killed_at + HELD_TTL_S - 1:
                            break
                        await asyncio.sleep(0.05)
                assert held.lost is None
    total = sum(map(len, tokens.values()))
    new_leader = etcd_cluster.leader()
    print(f"acquisitions={total} after_leader_kill={after_kill} leader {victim}->{new_leader}")
    assert total == 240 and after_kill >= 100 and new_leader != victim
    # The service's calls did move off the dead member (serentak_etcd_failovers_total).
    assert (REGISTRY.get_sample_value("serentak_etcd_failovers_total") or 0.0) > failovers_before
    # The dead member comes back with its data and serves again.
    etcd_cluster.start(victim)
    etcd = Etcd(dataclasses.replace(options(etcd_cluster), endpoints=(endpoints[victim],)))
    try:
        holder = await etcd.first_created(b"/cluster-test/acme/")
        assert holder is None  # every lock was released
    finally:
        await etcd.close()
    for key, seen in tokens.items():
        assert all(a < b for a, b in itertools.pairwise(seen)), key
