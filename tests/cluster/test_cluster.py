"""The replicated deployment as docs/deploy-replicated.md builds it, from nothing, by its
own commands and settings (cluster/deployment.py): PostgreSQL over TLS, a 3-member etcd
with mTLS and auth, an S3 store over TLS (a private CA's certificate, `S3_CA_FILE`), two
replicas of each service with TLS on every call (mTLS to locks) and JWT auth with the
guide's tokens; then the workload of
cluster/workload.py, and mid-run one upload replica (in the middle of merges), one notify
and one lock replica and the etcd leader are SIGKILLed, then restarted as the guide
starts them.

Asserted: every upload completed exactly once (one content event per upload) with the
right bytes in the store; no object in the store that the database does not account for,
and no multipart upload left open; every stream got each (file, version) of its user
exactly once and the same set the database holds, including each content version and
rename; fencing tokens strictly increasing per key; no INTERNAL anywhere, no valid token
refused (no UNAUTHENTICATED seen by a client or logged by a service), no asyncio warning
in any service's log; and etcd refuses every certificate but the lock service's under the
lock prefix. The counts are printed.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from pathlib import Path

import pytest
from cluster.checks import activity, check_database_and_store, log_problems
from cluster.deployment import Deployment, deployed
from cluster.workload import (
    DEADLINE_S,
    FILES,
    Replicas,
    Stream,
    Tally,
    World,
    bearer,
    download,
    first_uploads,
    list_all,
    lock_loop,
)
from serentak.locks.v1 import locks_pb2_grpc
from serentak.notify.v1 import notify_pb2_grpc
from serentak.upload.v1 import upload_pb2_grpc
from support.s3 import S3Server

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.etcd]


@pytest.fixture
def s3_server(s3_factory) -> S3Server:  # type: ignore[no-untyped-def]
    """A private s3s-fs (its folder is inspected for orphans at the end)."""
    return s3_factory()


def _world(deployment: Deployment, tally: Tally) -> World:
    def replicas(service: str, stub_cls: object) -> Replicas:
        security = deployment.user_security(service)
        return Replicas(deployment.addresses(service), stub_cls, tally, security)

    upload_db = deployment.upload["SERENTAK_UPLOAD_DATABASE_URL"]
    return World(
        upload=replicas("upload", upload_pb2_grpc.UploadServiceStub),
        files=replicas("upload", upload_pb2_grpc.FileServiceStub),
        notify=replicas("notify", notify_pb2_grpc.NotifyServiceStub),
        tally=tally,
        alice=bearer(deployment.token("alice")),
        diagnose=lambda: activity(upload_db),
    )


async def _chaos(
    deployment: Deployment, world: World, kills: list[str], marks: dict[str, float]
) -> None:
    """Once enough uploads are done: SIGKILL upload-1, notify-1, locks-1 and the etcd
    leader, then start each again by the guide's block and wait for the guide's check."""
    await world.chaos_started.wait()
    marks["kills"] = time.monotonic()
    leader = await asyncio.to_thread(deployment.etcd_leader)
    victims = [deployment.process(name, 1) for name in ("upload", "notify", "locks")]
    for proc in [*victims, deployment.process("etcd", leader)]:
        proc.kill()
        kills.append(f"{proc.name}-{proc.n}")
    await asyncio.to_thread(deployment.restart, deployment.process("etcd", leader))
    await asyncio.to_thread(deployment.restart, *victims)
    marks["restarted"] = time.monotonic()


async def _delivered(world: World, streams: list[Stream], tokens: dict[str, str]) -> dict:
    """Wait until every stream holds what the database holds; that set per user."""
    expected: dict[str, set[tuple[str, int]]] = {}
    deadline = time.monotonic() + DEADLINE_S
    for user in ("bob", "carol"):
        while True:
            listed = await list_all(world.notify, tokens[user])
            keys = {(n.file_id, n.version) for n in listed}
            must = {(world.upload_file[u], v) for u, v in world.versions.items()}
            must -= {(world.upload_file[u], world.versions[u]) for u in first_uploads(world)}
            must |= set(world.renames.items())
            if must <= keys and all(
                {(n.file_id, n.version) for n in s.got} >= keys for s in streams if s.user == user
            ):
                expected[user] = keys
                break
            assert time.monotonic() < deadline, (user, sorted(must - keys))
            await asyncio.sleep(0.2)  # poll until delivered, bounded
    return expected


async def test_the_guide_deploys_replicas_that_survive_kills(
    postgres, s3_server: S3Server, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    if not postgres.ssl_on():
        pytest.fail("the guide's PostgreSQL hop is TLS: this server has ssl = off")
    started = time.monotonic()
    with deployed(tmp_path, postgres, s3_server) as deployment:
        up_s = time.monotonic() - started
        # etcd auth as the guide sets it: only the lock service's certificate, only its prefix.
        assert deployment.etcd_refuses(b"/serentak/locks/x", as_="upload")
        assert deployment.etcd_refuses(b"/elsewhere", as_="etcd-client")
        tally = Tally()
        world = _world(deployment, tally)
        tokens = {user: deployment.token(user) for user in ("bob", "carol")}
        streams = [
            Stream("bob", tokens["bob"], "bob-a", 0),
            Stream("bob", tokens["bob"], "bob-b", 1),
            Stream("carol", tokens["carol"], "carol-b", 1),
            Stream("carol", tokens["carol"], "carol-a", 0),
        ]
        locks = Replicas(
            deployment.addresses("locks"),
            locks_pb2_grpc.LockServiceStub,
            tally,
            deployment.service_security(),
        )
        readers = [asyncio.create_task(s.run(world.notify)) for s in streams]
        stop_locks = asyncio.Event()
        service_token = deployment.token("upload")  # the upload principal may lock file: keys
        lockers = [
            asyncio.create_task(lock_loop(locks, f"file:cluster-{k}", service_token, stop_locks))
            for k in range(3)
        ]
        kills: list[str] = []
        marks = {"up": time.monotonic()}
        chaos_task = asyncio.create_task(_chaos(deployment, world, kills, marks))
        try:
            await asyncio.gather(*(world.file_life(n) for n in range(FILES)))
            marks["uploaded"] = time.monotonic()
            await asyncio.wait_for(chaos_task, DEADLINE_S)
            stop_locks.set()
            fencing = await asyncio.gather(*lockers)
            expected = await _delivered(world, streams, tokens)
            marks["delivered"] = time.monotonic()
            for s in streams:
                delivered = [(n.file_id, n.version) for n in s.got]
                dupes = [k for k, c in Counter(delivered).items() if c > 1]
                assert not dupes, f"{s.device} got {dupes} twice"
                assert set(delivered) == expected[s.user], s.device
                cursors = [int(n.cursor) for n in s.got]
                assert cursors == sorted(cursors), f"{s.device} out of order"
            # Bytes: each file's current content via Download, and every version's object.
            for file_id, data in world.last_bytes.items():
                assert await download(world.files, file_id, world.alice) == data
            prefix = deployment.upload["SERENTAK_BLOB_URL"].split("/", 3)[3]
            upload_db = deployment.upload["SERENTAK_UPLOAD_DATABASE_URL"]
            check_database_and_store(world, upload_db, s3_server, prefix)
        finally:
            for task in [*readers, *lockers, chaos_task]:
                task.cancel()
            for r in (world.upload, world.files, world.notify, locks):
                await r.close()
        workload_s = time.monotonic() - started - up_s
    # Stopped as a supervisor stops them (SIGTERM): their logs are complete.
    logs = {f"{p.name}-{p.n}": p.log_text() for p in deployment.guide.all_processes()}
    for key_tokens in fencing:
        assert key_tokens, "a lock loop never acquired"
        assert all(a < b for a, b in itertools.pairwise(key_tokens)), key_tokens
    refused = [k for k in tally.errors if k.endswith((":INTERNAL", ":UNAUTHENTICATED"))]
    assert not refused, tally.errors
    services = {k: v for k, v in logs.items() if k.split("-")[0] in {"upload", "locks", "notify"}}
    assert all('"rpc_completed"' in t for t in services.values()), "log format changed?"
    assert log_problems(services) == []
    after = ", ".join(f"{k} at {v - marks['up']:.0f} s" for k, v in marks.items() if k != "up")
    timings = sorted(deployment.guide.timings, key=lambda t: -t[1])
    slowest = ", ".join(f"{label} {seconds:.0f} s" for label, seconds in timings[:3])
    print(
        f"\ncluster from {deployment.guide.path.name}: up in {up_s:.0f} s "
        f"({len(deployment.guide.timings)} blocks; slowest {slowest}), "
        f"{len(world.uploads)} uploads completed once each, "
        f"{len(world.renames)} renames, {sum(len(s.got) for s in streams)} stream deliveries "
        f"over {len(streams)} streams ({sum(s.hops for s in streams)} reconnects), "
        f"lock tokens {[len(t) for t in fencing]} per key, killed {kills}, "
        f"client failovers {tally.failovers}, errors seen {dict(tally.errors)}, "
        f"workload {workload_s:.0f} s ({after}), {time.monotonic() - started:.0f} s in all"
    )
