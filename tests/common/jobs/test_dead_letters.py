"""Dead letters: permanent errors at once, bugs after retries, replay through AdminService."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from serentak.admin.v1 import admin_pb2, admin_pb2_grpc
from sqlalchemy import func, select
from support.grpc_errors import error_info
from support.services import running_app

from services.common.admin import admin_servicer
from services.common.auth import Authenticator
from services.common.correlation import bound_correlation_id
from services.common.grpc_server import ServiceApp
from services.common.jobs import (
    JobContext,
    JobRegistry,
    NewJob,
    PermanentError,
    RetryPolicy,
    Worker,
    enqueue,
)
from services.common.jobs.models import applied_jobs, dead_letters, jobs

REPO = Path(__file__).resolve().parents[3]
SERVICE_MD = [("authorization", "Bearer dev-ops")]  # admin RPCs need the ops role


class Broken:
    """A handler that fails a set number of times, then applies its effect."""

    def __init__(self, failures: int, exc: type[Exception]) -> None:
        self.failures = failures
        self.exc = exc
        self.calls = 0
        self.effects = 0

    async def __call__(self, ctx: JobContext) -> None:
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise self.exc(f"failure on attempt {ctx.attempt}")
        self.effects += 1
        ctx.effect = {"applied": True}


async def _drain(worker: Worker) -> None:
    """Run jobs until none is claimable (retries here have zero delay)."""
    while await worker.run_once():
        pass


async def _dead(db) -> list:  # type: ignore[no-untyped-def]
    async with db.sessions() as session, session.begin():
        return list((await session.execute(select(dead_letters))).all())


async def test_permanent_error_is_dead_lettered_at_once_with_every_field(runtime_db) -> None:  # type: ignore[no-untyped-def]
    handler = Broken(99, PermanentError)
    registry = JobRegistry()
    registry.register("t", handler, retry=RetryPolicy(max_attempts=5, base_seconds=0))
    with bound_correlation_id("corr-1"):
        async with runtime_db.sessions() as session, session.begin():
            job_id = await enqueue(
                session, NewJob("t", {"file_id": "f1", "version": 3}, "f1", "k1")
            )
    await _drain(Worker(runtime_db.sessions, registry, worker_id="worker-7"))
    assert handler.calls == 1
    [dl] = await _dead(runtime_db)
    assert (dl.job_id, dl.job_type, dl.partition_key, dl.idempotency_key) == (
        job_id,
        "t",
        "f1",
        "k1",
    )
    assert dl.payload == {"file_id": "f1", "version": 3}
    assert dl.error_class == "permanent"
    assert dl.error_type.endswith("PermanentError") and "attempt 1" in dl.error_message
    assert "Traceback" in dl.traceback and "PermanentError" in dl.traceback
    assert dl.attempts == 1 and dl.worker_id == "worker-7" and dl.correlation_id == "corr-1"
    assert dl.first_attempt_at <= dl.last_attempt_at <= dl.dead_at
    async with runtime_db.sessions() as session, session.begin():
        assert (await session.execute(select(func.count()).select_from(jobs))).scalar() == 0


async def test_bug_is_retried_then_dead_lettered(runtime_db) -> None:  # type: ignore[no-untyped-def]
    handler = Broken(99, KeyError)
    registry = JobRegistry()
    registry.register("t", handler, retry=RetryPolicy(max_attempts=3, base_seconds=0))
    async with runtime_db.sessions() as session, session.begin():
        await enqueue(session, NewJob("t", {}, "p", "k"))
    await _drain(Worker(runtime_db.sessions, registry, worker_id="w"))
    assert handler.calls == 3
    [dl] = await _dead(runtime_db)
    assert dl.error_class == "bug" and dl.attempts == 3 and dl.error_type == "builtins.KeyError"


async def test_replay_applies_once_and_a_second_replay_is_a_no_op(runtime_db) -> None:  # type: ignore[no-untyped-def]
    handler = Broken(1, PermanentError)
    registry = JobRegistry()
    registry.register("t", handler, retry=RetryPolicy(max_attempts=3, base_seconds=0))
    async with runtime_db.sessions() as session, session.begin():
        await enqueue(session, NewJob("t", {"x": 1}, "p", "k"))
    worker = Worker(runtime_db.sessions, registry, worker_id="w")
    await _drain(worker)
    [dl] = await _dead(runtime_db)
    auth = Authenticator.dev()
    app = ServiceApp("t", "127.0.0.1", 0, 0, [admin_servicer(runtime_db.sessions, auth)])
    async with running_app(app) as running:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.app.bound_port}") as channel:
            stub = admin_pb2_grpc.AdminServiceStub(channel)
            listed = await stub.ListDeadLetters(
                admin_pb2.ListDeadLettersRequest(), metadata=SERVICE_MD
            )
            assert [d.id for d in listed.dead_letters] == [dl.id]
            assert json.loads(listed.dead_letters[0].payload_json) == {"x": 1}
            stats = await stub.QueueStats(admin_pb2.QueueStatsRequest(), metadata=SERVICE_MD)
            assert stats.dead_letter_count == 1
            first = await stub.ReplayDeadLetter(
                admin_pb2.ReplayDeadLetterRequest(id=dl.id), metadata=SERVICE_MD
            )
            assert first.enqueued
            await _drain(worker)
            second = await stub.ReplayDeadLetter(
                admin_pb2.ReplayDeadLetterRequest(id=dl.id), metadata=SERVICE_MD
            )
            assert not second.enqueued and second.job_id == first.job_id
            await _drain(worker)
            # Bad input and missing credentials get precise statuses, never INTERNAL.
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await stub.ReplayDeadLetter(
                    admin_pb2.ReplayDeadLetterRequest(id=dl.id + 100), metadata=SERVICE_MD
                )
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND
            with pytest.raises(grpc.aio.AioRpcError) as user:
                await stub.QueueStats(
                    admin_pb2.QueueStatsRequest(), metadata=[("authorization", "Bearer dev-alice")]
                )
            assert user.value.code() == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await stub.ListDeadLetters(
                    admin_pb2.ListDeadLettersRequest(page_token="x"), metadata=SERVICE_MD
                )
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error_info(bad.value).reason == "INVALID_PAGE_TOKEN"
    assert handler.effects == 1 and handler.calls == 2
    async with runtime_db.sessions() as session, session.begin():
        assert (await session.execute(select(func.count()).select_from(applied_jobs))).scalar() == 1
        assert (await session.execute(select(func.count()).select_from(jobs))).scalar() == 0


async def test_replay_of_an_already_applied_key_has_no_second_effect(runtime_db) -> None:  # type: ignore[no-untyped-def]
    handler = Broken(1, PermanentError)
    registry = JobRegistry()
    registry.register("t", handler)
    async with runtime_db.sessions() as session, session.begin():
        await enqueue(session, NewJob("t", {}, "p", "k"))
    worker = Worker(runtime_db.sessions, registry, worker_id="w")
    await _drain(worker)
    async with runtime_db.sessions() as session, session.begin():
        await enqueue(session, NewJob("t", {}, "p", "k"))  # a redelivery applies the key
    await _drain(worker)
    from services.common.jobs.dead_letters import replay_dead_letter

    [dl] = await _dead(runtime_db)
    async with runtime_db.sessions() as session, session.begin():
        assert (await replay_dead_letter(session, dl.id)).enqueued
    await _drain(worker)
    assert handler.effects == 1 and handler.calls == 2


async def test_cli_prints_tables_and_purges(runtime_db) -> None:  # type: ignore[no-untyped-def]
    registry = JobRegistry()
    registry.register("t", Broken(99, PermanentError))
    async with runtime_db.sessions() as session, session.begin():
        await enqueue(session, NewJob("t", {}, "p", "k"))
    await _drain(Worker(runtime_db.sessions, registry, worker_id="w"))
    auth = Authenticator.dev()
    app = ServiceApp("t", "127.0.0.1", 0, 0, [admin_servicer(runtime_db.sessions, auth)])
    async with running_app(app) as running:
        address = f"127.0.0.1:{running.app.bound_port}"

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            env = {
                "PYTHONPATH": str(REPO),
                "COLUMNS": "200",
                "PATH": "/usr/bin",
                "SERENTAK_AUTH_MODE": "dev",  # the CLI then calls as `ops` with dev-ops
            }
            return subprocess.run(
                [sys.executable, "-m", "services.common.admin", "--address", address, *args],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )

        import asyncio

        stats = await asyncio.to_thread(cli, "stats")
        assert stats.returncode == 0 and "dead letters: 1" in stats.stdout, stats.stderr
        listed = await asyncio.to_thread(cli, "dead-letters")
        assert "PermanentError" in listed.stdout and "permanent" in listed.stdout
        denied = await asyncio.to_thread(cli, "--token", "dev-alice", "stats")
        assert denied.returncode == 2 and "PERMISSION_DENIED" in denied.stdout
        purged = await asyncio.to_thread(cli, "purge", "--job-type", "t")
        assert "purged 1" in purged.stdout
    assert await _dead(runtime_db) == []
