"""Several worker processes over one queue: exactly-once effects, per-key order, leases."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from common.jobs.worker_proc import JOB_TYPE, effects_metadata, job_effects
from sqlalchemy import create_engine as create_sync_engine
from sqlalchemy import func, select

from services.common.db import sync_url
from services.common.jobs import NewJob, enqueue
from services.common.jobs.models import dead_letters, jobs

REPO = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("worker_proc.py")
DEADLINE_S = 120.0


def _env() -> dict[str, str]:
    paths = [str(REPO), str(REPO / "tests")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _spawn(url: str, worker_id: str, tmp: Path, *extra: str) -> subprocess.Popen[bytes]:
    log = open(tmp / f"{worker_id}.log", "wb")
    return subprocess.Popen(
        [sys.executable, str(WORKER), url, worker_id, *extra],
        env=_env(),
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.terminate()
    for p in started:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _create_effects_table(url: str) -> None:
    engine = create_sync_engine(sync_url(url))
    effects_metadata.create_all(engine)
    engine.dispose()


async def _wait_for(runtime_db, condition, procs, tmp: Path) -> None:  # type: ignore[no-untyped-def]
    """Poll the database until `condition(session)` holds or the deadline passes."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        async with runtime_db.sessions() as session, session.begin():
            if await condition(session):
                return
        for p in procs:
            assert p.poll() in (None, -signal.SIGKILL), (tmp / "logs").as_posix()
        # Polling an observable condition with a deadline, not a sleep standing in for sync.
        await __import__("asyncio").sleep(0.1)
    raise AssertionError("condition not met before the deadline")


async def test_processes_apply_every_job_once_in_key_order(
    runtime_db, tmp_path: Path, processes
) -> None:  # type: ignore[no-untyped-def]
    keys, per_key = 50, 40  # 2000 jobs
    _create_effects_table(runtime_db.url)
    async with runtime_db.sessions() as session, session.begin():
        for seq in range(per_key):
            for k in range(keys):
                await enqueue(
                    session,
                    NewJob(JOB_TYPE, {"key": f"k{k}", "seq": seq}, f"k{k}", f"k{k}:{seq}"),
                )
    for i in range(3):
        processes.append(_spawn(runtime_db.url, f"w{i}", tmp_path))

    async def all_done(session) -> bool:  # type: ignore[no-untyped-def]
        left = (await session.execute(select(func.count()).select_from(jobs))).scalar_one()
        return left == 0

    await _wait_for(runtime_db, all_done, processes, tmp_path)
    async with runtime_db.sessions() as session, session.begin():
        rows = (await session.execute(select(job_effects).order_by(job_effects.c.id))).all()
        dead = (await session.execute(select(func.count()).select_from(dead_letters))).scalar()
    assert dead == 0
    assert len(rows) == keys * per_key
    assert len({r.idempotency_key for r in rows}) == keys * per_key
    seen: dict[str, list[int]] = {}
    for r in rows:
        seen.setdefault(r.partition_key, []).append(r.seq)
    assert all(seqs == list(range(per_key)) for seqs in seen.values())
    # The work really was shared between processes.
    assert len({r.worker_id for r in rows}) >= 2


async def test_sigkilled_worker_job_completes_once_after_lease(
    runtime_db, tmp_path: Path, processes
) -> None:  # type: ignore[no-untyped-def]
    _create_effects_table(runtime_db.url)
    marker = tmp_path / "started"
    async with runtime_db.sessions() as session, session.begin():
        await enqueue(session, NewJob(JOB_TYPE, {"key": "a", "seq": 0, "hang": True}, "a", "a:0"))
        await enqueue(session, NewJob(JOB_TYPE, {"key": "a", "seq": 1}, "a", "a:1"))
    lease = "2"
    victim = _spawn(
        runtime_db.url, "victim", tmp_path, "--lease", lease, "--hang-marker", str(marker)
    )
    processes.append(victim)
    deadline = time.monotonic() + DEADLINE_S
    while not marker.exists():
        assert time.monotonic() < deadline and victim.poll() is None
        await __import__("asyncio").sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed_at = time.monotonic()
    async with runtime_db.sessions() as session, session.begin():
        status = (
            await session.execute(select(jobs.c.status).where(jobs.c.idempotency_key == "a:0"))
        ).scalar_one()
    assert status == "running"  # stuck until its lease ends, and no longer
    processes.append(
        _spawn(runtime_db.url, "rescuer", tmp_path, "--lease", lease, "--hang-marker", str(marker))
    )

    async def both_applied(session) -> bool:  # type: ignore[no-untyped-def]
        n = (await session.execute(select(func.count()).select_from(job_effects))).scalar_one()
        return n >= 2

    await _wait_for(runtime_db, both_applied, processes, tmp_path)
    async with runtime_db.sessions() as session, session.begin():
        rows = (await session.execute(select(job_effects).order_by(job_effects.c.id))).all()
        left = (await session.execute(select(func.count()).select_from(jobs))).scalar_one()
    assert [(r.idempotency_key, r.worker_id) for r in rows] == [
        ("a:0", "rescuer"),
        ("a:1", "rescuer"),
    ]
    assert rows[0].attempt == 2  # the killed attempt counted
    assert left == 0
    assert time.monotonic() - killed_at < DEADLINE_S
