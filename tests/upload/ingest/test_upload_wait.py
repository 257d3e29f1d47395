"""GetUpload's `wait_finished_ms`: the server answers once the upload has finished, without
the client polling (services/upload/ingest/finish_waits.py), on SQLite and PostgreSQL.

The waits here would take seconds longer if the in-process notifier did not wake them: the
fallback re-read is set to a minute except in the two-replica test, which is about it."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from dataclasses import replace

import grpc
import pytest
from prometheus_client import REGISTRY
from serentak.sdk import SerentakClient
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from upload.cli_helpers import serentak, start
from upload.upload_helpers import (
    chunk_request,
    create_request,
    expect_error,
    split,
    upload_completed,
)

from services.common.auth import Identity
from services.common.grpc_server import start as start_app
from services.common.jobs import RuntimeOptions
from services.upload.app import build_app as build_upload_app
from services.upload.ingest.finish_waits import FinishSignals
from services.upload.ingest.uploads import transition
from services.upload.models import ABORTED, UPLOADING
from services.upload.sync.settings import SyncSettings

CHUNK = 1024
NO_FALLBACK = {"upload_wait_recheck_ms": 60_000}
# Bounds the test's own waits on the server-side state (never the behaviour under test).
SETTLE_S = 20.0


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _waiters() -> float:
    return _value("serentak_upload_waiters")


async def _until(condition, what: str) -> None:
    """Let the event loop run until `condition()` holds (the server registered a waiter...)."""
    deadline = time.monotonic() + SETTLE_S
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.005)


def _wait(client, upload_id: str, wait_ms: int, **kw):
    return client.uploads.GetUpload(
        upload_pb2.GetUploadRequest(upload_id=upload_id, wait_finished_ms=wait_ms),
        metadata=client.metadata,
        **kw,
    )


async def _half_sent(client, data: bytes) -> upload_pb2.Upload:
    """An upload of `data` in 2+ chunks with every chunk but the last stored."""
    upload = await client.uploads.CreateUpload(
        create_request(data, CHUNK, name=f"{uuid.uuid4().hex}.bin"), metadata=client.metadata
    )
    chunks = split(data, CHUNK)
    for i in range(len(chunks) - 1):
        await client.uploads.PutChunk(
            chunk_request(upload.upload_id, i, chunks[i]), metadata=client.metadata
        )
    return upload


async def _send_last(client, upload_id: str, data: bytes) -> None:
    chunks = split(data, CHUNK)
    await client.uploads.PutChunk(
        chunk_request(upload_id, len(chunks) - 1, chunks[-1]), metadata=client.metadata
    )


@pytest.mark.parametrize("settings_overrides", [NO_FALLBACK])
async def test_wait_answers_completed_right_after_the_merge_commits(cluster) -> None:
    alice = cluster["alice"]
    data = os.urandom(CHUNK + 10)
    upload = await _half_sent(alice, data)
    finished = _value("serentak_upload_wait_seconds_count", outcome="finished")
    waiting = asyncio.ensure_future(_wait(alice, upload.upload_id, 30_000))
    await _until(lambda: _waiters() == 1, "the wait never registered")
    assert not waiting.done()

    await _send_last(alice, upload.upload_id, data)
    # Woken by the merge's commit in this process: the fallback re-read is a minute away.
    done = await asyncio.wait_for(waiting, SETTLE_S)
    assert done.status == upload_pb2.UPLOAD_STATUS_COMPLETED
    assert done.file_version == 1 and done.file_id
    assert _value("serentak_upload_wait_seconds_count", outcome="finished") == finished + 1
    assert _waiters() == 0


@pytest.mark.parametrize("settings_overrides", [NO_FALLBACK])
async def test_a_wait_that_runs_out_answers_the_current_state(cluster) -> None:
    alice = cluster["alice"]
    upload = await _half_sent(alice, os.urandom(3 * CHUNK))
    timed_out = _value("serentak_upload_wait_seconds_count", outcome="timed_out")
    started = time.monotonic()
    got = await _wait(alice, upload.upload_id, 300)
    assert time.monotonic() - started >= 0.3
    assert got.status == upload_pb2.UPLOAD_STATUS_UPLOADING
    assert got.received_chunk_count == 2
    assert [(r.start, r.end) for r in got.missing_ranges] == [(2, 3)]
    assert _value("serentak_upload_wait_seconds_count", outcome="timed_out") == timed_out + 1

    # The call's own deadline cuts the wait short too: answered, not DEADLINE_EXCEEDED.
    got = await _wait(alice, upload.upload_id, 60_000, timeout=1.0)
    assert got.status == upload_pb2.UPLOAD_STATUS_UPLOADING
    assert _waiters() == 0


@pytest.mark.parametrize("settings_overrides", [{**NO_FALLBACK, "upload_wait_max_ms": 200}])
async def test_the_setting_caps_the_wait(cluster) -> None:
    alice = cluster["alice"]
    upload = await _half_sent(alice, os.urandom(2 * CHUNK))
    started = time.monotonic()
    got = await _wait(alice, upload.upload_id, 60_000, timeout=SETTLE_S)
    assert got.status == upload_pb2.UPLOAD_STATUS_UPLOADING
    assert time.monotonic() - started < 5


async def test_a_finished_upload_answers_at_once(cluster) -> None:
    alice = cluster["alice"]
    done = await upload_completed(alice, os.urandom(100), CHUNK)
    aborted = await _half_sent(alice, os.urandom(2 * CHUNK))
    await alice.uploads.AbortUpload(
        upload_pb2.AbortUploadRequest(upload_id=aborted.upload_id), metadata=alice.metadata
    )
    waits = sum(
        _value("serentak_upload_wait_seconds_count", outcome=o)
        for o in ("finished", "timed_out", "cancelled")
    )
    for upload_id, status in (
        (done.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED),
        (aborted.upload_id, upload_pb2.UPLOAD_STATUS_ABORTED),
    ):
        got = await _wait(alice, upload_id, 60_000, timeout=5.0)
        assert got.status == status
    assert got.status == upload_pb2.UPLOAD_STATUS_ABORTED
    # Nobody waited at all.
    assert waits == sum(
        _value("serentak_upload_wait_seconds_count", outcome=o)
        for o in ("finished", "timed_out", "cancelled")
    )


async def test_another_tenants_or_users_upload_is_not_found_before_any_wait(cluster) -> None:
    upload = await _half_sent(cluster["alice"], os.urandom(2 * CHUNK))
    for other in ("mallory", "bob"):  # another tenant; another user of alice's tenant
        started = time.monotonic()
        await expect_error(
            _wait(cluster[other], upload.upload_id, 5_000),
            grpc.StatusCode.NOT_FOUND,
            "UPLOAD_NOT_FOUND",
        )
        assert time.monotonic() - started < 2
    await expect_error(
        _wait(cluster["alice"], upload.upload_id, -1),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    )


@pytest.mark.parametrize("settings_overrides", [{**NO_FALLBACK, "upload_wait_max_waiters": 2}])
async def test_the_waiter_cap_refuses_with_its_reason(cluster) -> None:
    alice = cluster["alice"]
    data = os.urandom(2 * CHUNK)
    uploads = [await _half_sent(alice, data) for _ in range(3)]
    held = [asyncio.ensure_future(_wait(alice, u.upload_id, 30_000)) for u in uploads[:2]]
    await _until(lambda: _waiters() == 2, "the two waits never registered")

    info = await expect_error(
        _wait(alice, uploads[2].upload_id, 30_000),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "UPLOAD_WAITER_LIMIT",
    )
    assert info.metadata["max_waiters"] == "2"
    # Without a wait the same call is answered as ever.
    plain = await alice.uploads.GetUpload(
        upload_pb2.GetUploadRequest(upload_id=uploads[2].upload_id), metadata=alice.metadata
    )
    assert plain.status == upload_pb2.UPLOAD_STATUS_UPLOADING

    for u in uploads[:2]:
        await _send_last(alice, u.upload_id, data)
    for answer in await asyncio.wait_for(asyncio.gather(*held), SETTLE_S):
        assert answer.status == upload_pb2.UPLOAD_STATUS_COMPLETED
    assert _waiters() == 0


@pytest.mark.parametrize("settings_overrides", [NO_FALLBACK])
async def test_a_cancelled_wait_leaves_no_waiter(cluster) -> None:
    alice = cluster["alice"]
    data = os.urandom(2 * CHUNK)
    upload = await _half_sent(alice, data)
    cancelled = _value("serentak_upload_wait_seconds_count", outcome="cancelled")
    call = _wait(alice, upload.upload_id, 30_000)
    await _until(lambda: _waiters() == 1, "the wait never registered")
    call.cancel()
    await _until(lambda: _waiters() == 0, "the cancelled wait stayed registered")
    assert _value("serentak_upload_wait_seconds_count", outcome="cancelled") == cancelled + 1

    # A deadline nearer than the server's margin: answered at once, nothing registered.
    got = await _wait(alice, upload.upload_id, 30_000, timeout=0.15)
    assert got.status == upload_pb2.UPLOAD_STATUS_UPLOADING
    assert _waiters() == 0
    # The upload still finishes, and a new wait sees it.
    await _send_last(alice, upload.upload_id, data)
    done = await _wait(alice, upload.upload_id, 30_000, timeout=SETTLE_S)
    assert done.status == upload_pb2.UPLOAD_STATUS_COMPLETED
    await _until(lambda: _waiters() == 0, "a waiter stayed registered")


@pytest.mark.parametrize("settings_overrides", [{"upload_wait_recheck_ms": 100}])
async def test_a_finish_committed_by_another_replica_is_seen_through_the_recheck(
    cluster, runtime_options
) -> None:
    """Replica B waits; replica A (its own process state, same database) aborts the upload:
    B's notifier never hears of it, B's fallback re-read does."""
    alice = cluster["alice"]
    upload = await _half_sent(alice, os.urandom(2 * CHUNK))
    other = RuntimeOptions(
        node_id=f"{runtime_options.node_id}-b",
        concurrency=1,
        poll_interval=0.05,
        lease_seconds=10,
        stats_interval=60,
    )
    replica_b = build_upload_app(cluster.settings, other, SyncSettings(webhook_port=0))
    service = await start_app(replace(replica_b, port=0, metrics_port=0))
    stopped = False
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.app.bound_port}") as channel:
            stub = upload_pb2_grpc.UploadServiceStub(channel)
            rechecks = _value("serentak_upload_wait_rechecks_total")
            waiting = asyncio.ensure_future(
                stub.GetUpload(
                    upload_pb2.GetUploadRequest(
                        upload_id=upload.upload_id, wait_finished_ms=30_000
                    ),
                    metadata=alice.metadata,
                )
            )
            await _until(lambda: _waiters() == 1, "the wait on B never registered")
            await alice.uploads.AbortUpload(  # on replica A
                upload_pb2.AbortUploadRequest(upload_id=upload.upload_id), metadata=alice.metadata
            )
            got = await asyncio.wait_for(waiting, SETTLE_S)
            assert got.status == upload_pb2.UPLOAD_STATUS_ABORTED
            assert _value("serentak_upload_wait_rechecks_total") > rechecks

            # B stops while a call waits on it: the call is answered (as the upload is),
            # not held for the grace period and then cut off.
            second = await _half_sent(alice, os.urandom(2 * CHUNK))
            waiting = asyncio.ensure_future(
                stub.GetUpload(
                    upload_pb2.GetUploadRequest(
                        upload_id=second.upload_id, wait_finished_ms=30_000
                    ),
                    metadata=alice.metadata,
                )
            )
            await _until(lambda: _waiters() == 1, "the second wait on B never registered")
            stopped = True
            await service.stop()
            got = await asyncio.wait_for(waiting, SETTLE_S)
            assert got.status == upload_pb2.UPLOAD_STATUS_UPLOADING
    finally:
        if not stopped:
            await service.stop()
    assert _waiters() == 0


@pytest.mark.parametrize("settings_overrides", [NO_FALLBACK])
async def test_the_sdk_waits_with_one_get_upload(cluster) -> None:
    alice = cluster["alice"]
    data = os.urandom(CHUNK + 10)
    upload = await _half_sent(alice, data)
    labels = {
        "grpc_service": "serentak.upload.v1.UploadService",
        "grpc_method": "GetUpload",
        "grpc_type": "unary",
    }
    calls = _value("grpc_server_started_total", **labels)
    async with SerentakClient(cluster.address, token="dev-alice") as client:
        waiting = asyncio.ensure_future(client.wait_finished(upload.upload_id))
        await _until(lambda: _waiters() == 1, "the SDK's wait never registered")
        await _send_last(alice, upload.upload_id, data)
        done = await asyncio.wait_for(waiting, SETTLE_S)
    assert done.status == upload_pb2.UPLOAD_STATUS_COMPLETED and done.file_version == 1
    assert _value("grpc_server_started_total", **labels) == calls + 1


async def test_signals_fire_only_after_the_commit_and_never_for_a_rollback(parts) -> None:
    """`after_commit`: the job runtime commits the merge job's transaction, so the merge
    asks to be reported then; a rolled-back transaction reports nothing."""
    alice = Identity(tenant_id="t-wait", user_id="alice")
    row = await parts.uploads.create(alice, create_request(os.urandom(2 * CHUNK), CHUNK))
    signals = FinishSignals()
    with signals.watch(row.id) as woken:
        async with parts.sessions() as session:
            await transition(session, row.id, UPLOADING, ABORTED)
            signals.after_commit(session, row.id)
            await session.rollback()
        assert not woken.is_set()
        async with parts.sessions() as session:
            await transition(session, row.id, UPLOADING, ABORTED)
            signals.after_commit(session, row.id)
            await session.flush()
            assert not woken.is_set()  # not before the commit
            await session.commit()
            assert woken.is_set()
        assert signals.waiting == 1
    assert signals.waiting == 0
    # Still aborted once, by the committed transaction.
    upload, _ = await parts.uploads.get(alice, row.id)
    assert upload.status == ABORTED


@pytest.mark.parametrize(
    "settings_overrides",
    [{"upload_wait_max_ms": 0}, {"upload_wait_max_waiters": 0}],
    ids=["server-does-not-wait", "waiter-cap-reached"],
)
async def test_the_sdk_still_finishes_when_the_server_does_not_wait(cluster) -> None:
    """A server that answers at once (an older one, or waits turned off) or refuses the wait
    (UPLOAD_WAITER_LIMIT): the SDK asks again after a pause, never in a tight loop."""
    alice = cluster["alice"]
    data = os.urandom(CHUNK + 10)
    upload = await _half_sent(alice, data)
    async with SerentakClient(cluster.address, token="dev-alice") as client:
        waiting = asyncio.ensure_future(client.wait_finished(upload.upload_id, poll_seconds=0.05))
        await _send_last(alice, upload.upload_id, data)
        done = await asyncio.wait_for(waiting, SETTLE_S)
    assert done.status == upload_pb2.UPLOAD_STATUS_COMPLETED


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("settings_overrides", [NO_FALLBACK])
async def test_cli_status_waits_for_the_upload(cluster) -> None:
    """`serentak status ID --wait SECONDS` (SQLite only: the CLI is a client)."""
    alice = cluster["alice"]
    data = os.urandom(CHUNK + 10)
    upload = await _half_sent(alice, data)
    argv = ["--address", cluster.address, "--token", "dev-alice", "--json", "status"]
    started = time.monotonic()
    still = await serentak(*argv, upload.upload_id, "--wait", "0.5")
    assert still.code == 0, still.err
    assert still.json()["upload"]["status"] == "uploading"
    assert time.monotonic() - started >= 0.5

    proc = await start(*argv, upload.upload_id, "--wait", "60")
    await _until(lambda: _waiters() == 1, "the CLI's wait never registered")
    await _send_last(alice, upload.upload_id, data)
    out, err = await asyncio.wait_for(proc.communicate(), SETTLE_S)
    assert proc.returncode == 0, err
    assert json.loads(out)["upload"]["status"] == "completed"
