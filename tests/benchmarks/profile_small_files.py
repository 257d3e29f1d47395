"""UploadFile's use case in process and without gRPC: new 64 KiB files committed by
`UploadFiles.upload` (what the UploadFile RPC runs, the group commit included), `--at-once`
at a time; per file, the process's CPU (the event loop's and the worker threads': the
blob writes' fsyncs, SQLite's) and, on PostgreSQL, the statements sent to the server
(BEGIN and COMMIT not counted), beside what one statement costs a bare psycopg
AsyncConnection (a parameterised SELECT, answer read). `--postgres`: a server to create a
fresh database on for each run (`support.postgres.PostgresDatabases`, dropped after).
What the server spends beyond it (bench_small_files.py's "CPU ms/file: upload") is the
RPC layer, gRPC itself and the outbox relay.

    .venv/bin/python tests/benchmarks/profile_small_files.py [--repo DIR] [--postgres DSN]
        [--at-once 1,16,64] [--files 2000] [--timeline]

`--repo`: another checkout (with this tree's `.venv`) to compare its code in the same
window. `--timeline`: one file at a time only, and the median timeline of a file's commit
(its statements, psycopg's waits, the blob write, the COMMIT: `small_files_timeline.py`).
The first 200 files warm up and are not counted. A profile aid, not a target: issue #32's
numbers are bench_small_files.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import resource
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

WARM_UP = 200


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _count_statements(counts: collections.Counter[str]) -> None:
    """Count every statement psycopg sends (its cursors' execute and executemany)."""
    import psycopg

    for name in ("execute", "executemany"):
        original = getattr(psycopg.AsyncCursor, name)

        def counted(self: Any, query: Any, *args: Any, _original: Any = original, **kw: Any):
            counts[" ".join(str(query).split())[:60]] += 1
            return _original(self, query, *args, **kw)

        setattr(psycopg.AsyncCursor, name, counted)


async def _run(database_url: str, data_dir: Path, at_once: int, files: int) -> str:
    from serentak.upload.v1 import upload_pb2

    from services.common.auth import Identity
    from services.common.jobs import RuntimeOptions
    from services.upload.components import build_components
    from services.upload.database import migrate
    from services.upload.settings import UploadSettings
    from services.upload.sync.settings import SyncSettings

    migrate(database_url)
    settings = UploadSettings(
        upload_database_url=database_url,
        data_dir=data_dir,
        locks_address="127.0.0.1:1",  # a new file takes no lock
        publish_events=False,
    )
    options = RuntimeOptions(node_id="profile", concurrency=1, poll_interval=1, lease_seconds=10)
    parts = build_components(settings, options, SyncSettings(webhook_port=0))
    identity = Identity(tenant_id="acme", user_id="alice")
    datas = [os.urandom(64 * 1024) for _ in range(16)]
    counts: collections.Counter[str] = collections.Counter()
    if database_url.startswith("postgresql"):
        _count_statements(counts)

    async def one(i: int) -> None:
        request = upload_pb2.UploadFileRequest(
            new_file=upload_pb2.NewFileTarget(name=f"f-{i}-{uuid.uuid4().hex[:8]}"),
            data=datas[i % len(datas)],
            client_request_id=uuid.uuid4().hex,
        )
        await parts.upload_files.upload(identity, request)

    try:
        await asyncio.gather(*(one(i) for i in range(WARM_UP)))
        counts.clear()
        numbers = iter(range(files))

        async def worker() -> None:
            for i in numbers:
                await one(i)

        cpu, started = _cpu_seconds(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(at_once)))
        wall, cpu = time.perf_counter() - started, _cpu_seconds() - cpu
    finally:
        await parts.close()
    line = (
        f"{at_once:>3} at once: {files / wall:7.1f} files/s, "
        f"{cpu / files * 1000:5.2f} ms CPU a file"
    )
    if counts:
        line += f", {sum(counts.values()) / files:5.2f} statements a file"
    return line


async def _bare_statement(dsn: str, count: int = 2000) -> str:
    """CPU and wall time of one statement on a bare psycopg AsyncConnection."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn) as connection:
        cpu, started = _cpu_seconds(), time.perf_counter()
        for i in range(count):
            await (await connection.execute("SELECT %(n)s::int", {"n": i})).fetchall()
        wall, cpu = time.perf_counter() - started, _cpu_seconds() - cpu
    return (
        f"a bare psycopg statement: {cpu / count * 1e6:.0f} us CPU, "
        f"{wall / count * 1e6:.0f} us wall"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2])
    parser.add_argument("--postgres", metavar="DSN", help="a server to create a database on")
    parser.add_argument("--at-once", default="1,16,64")
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--timeline", action="store_true", help="one at a time, timed")
    args = parser.parse_args()
    sys.path[:0] = [str(args.repo), str(args.repo / "client"), str(args.repo / "tests")]
    sys.path.append(str(Path(__file__).resolve().parent))  # small_files_timeline
    os.environ.setdefault("SERENTAK_AUTH_MODE", "dev")
    from support.postgres import PostgresDatabases

    from services.common.logging import configure_logging

    configure_logging("upload", "json", "WARNING", once=True)
    databases = PostgresDatabases(args.postgres) if args.postgres else None
    timeline = None
    if args.timeline:
        from small_files_timeline import Timeline

        timeline = Timeline()
        timeline.install()
        args.at_once = "1"
    try:
        for at_once in (int(n) for n in args.at_once.split(",")):
            with tempfile.TemporaryDirectory(prefix="profile-small-") as tmp:
                url = databases.create() if databases else f"sqlite+aiosqlite:///{tmp}/upload.db"
                files = args.files if at_once > 1 else min(args.files, 500)
                print(asyncio.run(_run(url, Path(tmp) / "data", at_once, files)), flush=True)
        if timeline is not None:
            print("\n".join(timeline.report(min(args.files, 500) - 50)))
        if args.postgres:
            print(asyncio.run(_bare_statement(args.postgres)))
    finally:
        if databases:
            databases.drop_all()


if __name__ == "__main__":
    main()
