# ruff: noqa: E402 - the script puts a repository on sys.path before importing it
"""The chunk path's event-loop cost, in process and without gRPC: 4 senders call
`ChunkStore.prepare` + `commit` (what PutChunk runs) for every chunk of an upload; per
chunk, the loop thread's CPU time, the whole process's (worker threads too), the aiosqlite
thread hand-offs and the `to_thread` calls, and the median prepare / commit latency.

    .venv/bin/python tests/benchmarks/profile_chunk_loop.py [--repo DIR] [--postgres DSN]
        [--chunk-kib 4096] [--chunks 32] [--rounds 4]

`--repo`: another checkout (e.g. `git archive` of an older commit, with this tree's
`.venv`, whose editable client holds the stubs) to compare its code in the same window.
The first round warms up and is not printed. A profile aid, not a target: issue #15's
numbers are bench_upload.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

SENDERS = 4


def parse() -> argparse.Namespace:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2])
    parser.add_argument("--postgres", metavar="DSN", help="a server to create a database on")
    parser.add_argument("--chunk-kib", type=int, default=4096)
    parser.add_argument("--chunks", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4)
    return parser.parse_args()


ARGS = parse()
sys.path[:0] = [str(ARGS.repo), str(ARGS.repo / "tests")]
os.environ.setdefault("SERENTAK_AUTH_MODE", "dev")

import aiosqlite
import psycopg
from sqlalchemy.engine import make_url
from upload.upload_helpers import create_request, split

from services.common.auth import Identity
from services.common.jobs.runtime import RuntimeOptions
from services.common.logging import configure_logging
from services.upload.components import build_components
from services.upload.database import prepare
from services.upload.settings import UploadSettings
from services.upload.sync.settings import SyncSettings

HAND_OFFS = [0]
TO_THREAD = [0]
_execute = aiosqlite.Connection._execute
_to_thread = asyncio.to_thread


async def _counted_execute(
    self: aiosqlite.Connection, fn: object, *args: object, **kwargs: object
) -> object:
    HAND_OFFS[0] += 1
    return await _execute(self, fn, *args, **kwargs)  # type: ignore[arg-type]


async def _counted_to_thread(fn: object, *args: object, **kwargs: object) -> object:
    TO_THREAD[0] += 1
    return await _to_thread(fn, *args, **kwargs)  # type: ignore[arg-type]


aiosqlite.Connection._execute = _counted_execute  # type: ignore[method-assign]
asyncio.to_thread = _counted_to_thread


def database_url(tmp: Path) -> str:
    """A SQLite file in `tmp`, or a fresh database on `--postgres`'s server."""
    if not ARGS.postgres:
        return f"sqlite+aiosqlite:///{tmp}/profile.db"
    name = f"serentak_profile_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ARGS.postgres, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(ARGS.postgres).set(drivername="postgresql+psycopg", database=name)
    return url.render_as_string(hide_password=False)


async def one_round(parts: Any, number: int) -> str:
    """Upload one file with SENDERS concurrent senders; its per-chunk costs."""
    who = Identity(tenant_id="t", user_id="alice")
    size = ARGS.chunk_kib * 1024
    data = os.urandom(size * ARGS.chunks)
    upload = await parts.uploads.create(who, create_request(data, size, name=f"p{number}.bin"))
    chunks = split(data, size)
    sums = [hashlib.sha256(c).hexdigest() for c in chunks]
    queue = list(range(len(chunks)))
    phases: list[tuple[float, float]] = []

    async def sender() -> None:
        while queue:
            index = queue.pop()
            started = time.perf_counter()
            prepared = await parts.chunks.prepare(who, upload.id, index, chunks[index], sums[index])
            checked = time.perf_counter()
            await parts.chunks.commit(prepared)
            phases.append((checked - started, time.perf_counter() - checked))

    hand_offs, to_thread = HAND_OFFS[0], TO_THREAD[0]
    cpu, process, wall = time.thread_time(), time.process_time(), time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(SENDERS)))
    n = len(chunks)
    return (
        f"loop CPU {(time.thread_time() - cpu) * 1000 / n:.2f} ms/chunk, "
        f"process CPU {(time.process_time() - process) * 1000 / n:.2f} ms/chunk, "
        f"aiosqlite hand-offs {(HAND_OFFS[0] - hand_offs) / n:.1f}/chunk, "
        f"to_thread {(TO_THREAD[0] - to_thread) / n:.1f}/chunk, "
        f"wall {(time.perf_counter() - wall) * 1000 / n:.2f} ms/chunk; "
        f"median prepare {statistics.median(p for p, _ in phases) * 1000:.1f} ms, "
        f"commit {statistics.median(c for _, c in phases) * 1000:.1f} ms"
    )


async def main(tmp: Path) -> None:
    """Build the upload components, upload `--rounds` files, print each round's costs."""
    configure_logging("upload", level="WARNING")  # as bench_upload runs the service
    url = database_url(tmp)
    prepare(url, migrate_on_start=True)
    settings = UploadSettings(
        upload_database_url=url,
        data_dir=tmp / "data",
        locks_address="127.0.0.1:1",  # no merge runs here
        min_chunk_size=1024,
        publish_events=False,
    )
    options = RuntimeOptions(
        node_id="profile", concurrency=1, poll_interval=60, lease_seconds=10, stats_interval=600
    )
    parts = build_components(settings, options, SyncSettings(webhook_port=0))
    try:
        for number in range(ARGS.rounds):
            line = await one_round(parts, number)
            if number:
                print(line, flush=True)
    finally:
        await parts.close()
        if ARGS.postgres:
            database = make_url(url).database
            with psycopg.connect(ARGS.postgres, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="profile_chunk_loop_") as folder:
        asyncio.run(main(Path(folder)))
