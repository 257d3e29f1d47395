# ruff: noqa: E402 - the script puts the repository on sys.path before importing it
"""File-tree benchmark: ListFolder of a deep folder as its owner and as a viewer.

    .venv/bin/python tests/benchmarks/bench_tree.py [--quick] [--depth N] [--entries N]
        [--rounds N] [--postgres postgresql://...]

Servers are processes of their own: a private etcd, `python -m services.locks`,
`python -m services.upload` (SQLite in a temp folder, or a fresh PostgreSQL database with
`--postgres`). Alice builds a chain of `--depth` folders (default 60) with `--entries`
children (default 200) at the bottom and shares the top with bob as viewer. Timed,
interleaved: alice's and bob's ListFolder of the bottom folder (one page of all entries),
then carol's CreateFolder alone and while bob lists in a loop (a viewer's listing must not
stall another user's write). The ratio viewer/owner is the number that matters: the caller's
role is worked out once per listing, so it stays near 1 whatever the depth.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import grpc
import psycopg
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from sqlalchemy.engine import make_url
from support.etcd import EtcdServer
from support.ports import free_port
from support.services import ServiceProcess, service_process

from services.common.config import sqlite_url

ALICE = (("authorization", "Bearer dev-alice"),)
BOB = (("authorization", "Bearer dev-bob"),)
CAROL = (("authorization", "Bearer dev-carol"),)


def postgres_database(stack: ExitStack, admin_dsn: str) -> str:
    """A fresh database on `admin_dsn`'s server, dropped when `stack` closes; its URL."""
    name = f"serentak_bench_tree_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    stack.callback(drop)
    url = make_url(admin_dsn).set(drivername="postgresql+psycopg", database=name)
    return url.render_as_string(hide_password=False)


def start_servers(
    stack: ExitStack, tmp: Path, postgres: str | None
) -> tuple[ServiceProcess, str, str]:
    """etcd, the lock service and the upload service: (upload, database URL, its label)."""
    etcd = EtcdServer(tmp / "etcd")
    etcd.start()
    stack.callback(etcd.stop)
    for folder in ("locks", "upload"):
        (tmp / folder).mkdir()
    quiet = {"SERENTAK_LOG_LEVEL": "WARNING"}
    locks = stack.enter_context(
        service_process("locks", tmp / "locks", {**quiet, "SERENTAK_ETCD_ENDPOINT": etcd.endpoint})
    )
    env = {
        **quiet,
        "SERENTAK_LOCKS_ADDRESS": locks.address,
        "SERENTAK_NOTIFY_ADDRESS": f"127.0.0.1:{free_port()}",
        "SERENTAK_PUBLISH_EVENTS": "false",
    }
    database = "SQLite (WAL, synchronous FULL)"
    if postgres:
        env["SERENTAK_UPLOAD_DATABASE_URL"] = postgres_database(stack, postgres)
        database = "PostgreSQL"
    upload = stack.enter_context(service_process("upload", tmp / "upload", env))
    url = env.get("SERENTAK_UPLOAD_DATABASE_URL") or sqlite_url(tmp / "upload" / "data", "upload")
    return upload, url, database


async def build_tree(files: upload_pb2_grpc.FileServiceStub, depth: int, entries: int) -> str:
    """Alice's chain of `depth` folders, shared at the top with bob; the bottom folder's id."""
    top = await files.CreateFolder(upload_pb2.CreateFolderRequest(name="deep"), metadata=ALICE)
    await files.ShareFile(
        upload_pb2.ShareFileRequest(
            file_id=top.file_id, user_id="bob", role=upload_pb2.ROLE_VIEWER
        ),
        metadata=ALICE,
    )
    parent = top.file_id
    for level in range(depth - 1):
        made = await files.CreateFolder(
            upload_pb2.CreateFolderRequest(name=f"level{level}", parent_id=parent), metadata=ALICE
        )
        parent = made.file_id
    for n in range(entries):
        await files.CreateFolder(
            upload_pb2.CreateFolderRequest(name=f"entry{n:04}", parent_id=parent), metadata=ALICE
        )
    return parent


async def list_once(
    files: upload_pb2_grpc.FileServiceStub, folder: str, md: tuple, entries: int, role: int
) -> float:
    """Seconds for one ListFolder of every entry; checks the caller's role on each."""
    start = time.perf_counter()
    page = await files.ListFolder(
        upload_pb2.ListFolderRequest(folder_id=folder, page_size=entries), metadata=md
    )
    elapsed = time.perf_counter() - start
    assert len(page.files) == entries and all(f.role == role for f in page.files), page
    return elapsed


async def measure(address: str, depth: int, entries: int, rounds: int) -> dict[str, list[float]]:
    """Interleaved owner/viewer listings, then carol's writes under a viewer's listing loop."""
    async with grpc.aio.insecure_channel(address) as channel:
        files = upload_pb2_grpc.FileServiceStub(channel)
        bottom = await build_tree(files, depth, entries)
        times: dict[str, list[float]] = {
            "owner": [],
            "viewer": [],
            "write alone": [],
            "write under load": [],
        }
        for n in range(rounds):
            start = time.perf_counter()
            await files.CreateFolder(
                upload_pb2.CreateFolderRequest(name=f"carol-alone-{n}"), metadata=CAROL
            )
            times["write alone"].append(time.perf_counter() - start)
            times["owner"].append(
                await list_once(files, bottom, ALICE, entries, upload_pb2.ROLE_OWNER)
            )
            times["viewer"].append(
                await list_once(files, bottom, BOB, entries, upload_pb2.ROLE_VIEWER)
            )
        stop = asyncio.Event()

        async def viewer_loop() -> None:
            while not stop.is_set():
                await list_once(files, bottom, BOB, entries, upload_pb2.ROLE_VIEWER)

        loop = asyncio.ensure_future(viewer_loop())
        try:
            for n in range(rounds):
                start = time.perf_counter()
                await files.CreateFolder(
                    upload_pb2.CreateFolderRequest(name=f"carol-{n}"), metadata=CAROL
                )
                times["write under load"].append(time.perf_counter() - start)
        finally:
            stop.set()
            await loop
        return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="10 rounds instead of 30")
    parser.add_argument("--depth", type=int, default=60)
    parser.add_argument("--entries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=0)
    parser.add_argument("--postgres", help="admin DSN: run on a fresh PostgreSQL database")
    args = parser.parse_args()
    rounds = args.rounds or (10 if args.quick else 30)
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-tree-") as tmp:
        upload, _, database = start_servers(stack, Path(tmp), args.postgres)
        times = asyncio.run(measure(upload.address, args.depth, args.entries, rounds))
    p50 = {case: statistics.median(values) * 1000 for case, values in times.items()}
    print(
        f"ListFolder of {args.entries} entries at depth {args.depth}, {database}, {rounds} rounds"
    )
    for case, ms in p50.items():
        print(f"  {case:<18} p50 {ms:8.2f} ms   max {max(times[case]) * 1000:8.2f} ms")
    print(f"  viewer/owner p50 ratio: {p50['viewer'] / p50['owner']:.2f}")


if __name__ == "__main__":
    main()
