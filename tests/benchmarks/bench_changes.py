# ruff: noqa: E402 - the script puts the repository on sys.path before importing it
"""Change feed benchmark: a client's catch-up across N changes, and commit-to-wake latency.

    .venv/bin/python tests/benchmarks/bench_changes.py [--quick] [--changes N] [--rounds N]
        [--postgres postgresql://...]

Servers are processes of their own: a private etcd, `python -m services.locks`,
`python -m services.upload` (SQLite in a temp folder, or a fresh PostgreSQL database with
`--postgres`). Alice's folder holds N-1 files (written straight into the database: the
setup is not what is measured); bob takes a cursor, then alice shares the folder with him:
N changes enter his view while he is away.

1. Catch-up: bob pages ListChanges from his cursor (1,000 a page) until nothing is left;
   changes/s and the upload process's CPU per change. Baseline, same run: what a client
   without a feed does to learn the same, re-listing everything it can see
   (ListSharedWithMe, then ListFolder of the folder, 1,000 a page). Every item changed is
   the feed's worst case; then alice renames `--few` files (100) and bob catches up again,
   beside the same re-listing: the everyday case of a client a little behind.
2. Commit to wake-up: bob waits in ListChanges (`wait_ms`) while alice renames a file;
   the time from sending the rename to bob's answer, per round. Baseline, same run: a
   client polling ListChanges once a second (the usual sync-client poll, without a long
   poll), from sending the rename to the poll that first sees it.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests" / "benchmarks")]

import grpc
from bench_small_files import cpu_seconds
from bench_tree import start_servers
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from support.services import ServiceProcess

from services.common.db import create_engine, session_factory
from services.upload.files.tree import new_folder
from services.upload.models import FILE

ALICE = (("authorization", "Bearer dev-alice"),)
BOB = (("authorization", "Bearer dev-bob"),)
PAGE = 1000
POLL_SECONDS = 1.0


async def seed_files(database_url: str, folder_id: str, count: int) -> None:
    """`count` empty files of alice's in `folder_id`, in one transaction."""
    engine = create_engine(database_url)
    try:
        async with session_factory(engine).begin() as session:
            for n in range(count):
                row = new_folder("acme", folder_id, f"item-{n:06}.txt", "alice")
                row.kind = FILE
                session.add(row)
    finally:
        await engine.dispose()


async def catch_up(files: upload_pb2_grpc.FileServiceStub, cursor: str) -> tuple[int, str]:
    """Pages from `cursor` until none is left: (changes received, the last cursor)."""
    received = 0
    while True:
        page = await files.ListChanges(
            upload_pb2.ListChangesRequest(cursor=cursor, page_size=PAGE), metadata=BOB
        )
        received += len(page.changes)
        cursor = page.next_cursor
        if not page.has_more:
            return received, cursor


async def relist(files: upload_pb2_grpc.FileServiceStub) -> int:
    """Everything shared with bob, walked down (his root is empty): items seen."""
    seen = 0
    shared = await files.ListSharedWithMe(
        upload_pb2.ListSharedWithMeRequest(page_size=PAGE), metadata=BOB
    )
    for item in shared.items:
        seen += 1
        token = ""
        while True:
            listed = await files.ListFolder(
                upload_pb2.ListFolderRequest(
                    folder_id=item.file.file_id, page_size=PAGE, page_token=token
                ),
                metadata=BOB,
            )
            seen += len(listed.files)
            token = listed.next_page_token
            if not token:
                break
    return seen


async def timed(pid: int, work) -> tuple[float, float, int]:
    """(wall seconds, server CPU seconds, result) of awaiting `work`."""
    cpu, start = cpu_seconds(pid), time.perf_counter()
    result = await work
    return time.perf_counter() - start, cpu_seconds(pid) - cpu, result


async def rename(files: upload_pb2_grpc.FileServiceStub, file_id: str, n: int) -> None:
    await files.RenameFile(
        upload_pb2.RenameFileRequest(file_id=file_id, new_name=f"renamed-{n}.txt"),
        metadata=ALICE,
    )


async def woken(files: upload_pb2_grpc.FileServiceStub, file_id: str, cursor: str, n: int):
    """Seconds from sending a rename to a waiting ListChanges answering it; the new cursor."""
    waiting = asyncio.ensure_future(
        files.ListChanges(
            upload_pb2.ListChangesRequest(cursor=cursor, wait_ms=30_000), metadata=BOB
        )
    )
    await asyncio.sleep(0.05)  # a benchmark's pause: let the call reach its wait
    sent = time.perf_counter()
    await rename(files, file_id, n)
    page = await waiting
    assert [c.file_id for c in page.changes] == [file_id], page
    return time.perf_counter() - sent, page.next_cursor


async def polled(files: upload_pb2_grpc.FileServiceStub, file_id: str, cursor: str, n: int):
    """Seconds from sending a rename to the first once-a-second poll that sees it."""
    phase = random.uniform(0, POLL_SECONDS)  # where in the poll cycle the change lands
    sent = time.perf_counter()
    await rename(files, file_id, n)
    await asyncio.sleep(max(0.0, phase - (time.perf_counter() - sent)))
    while True:
        page = await files.ListChanges(upload_pb2.ListChangesRequest(cursor=cursor), metadata=BOB)
        if page.changes:
            return time.perf_counter() - sent, page.next_cursor
        await asyncio.sleep(POLL_SECONDS)


async def measure(upload: ServiceProcess, url: str, changes: int, few: int, rounds: int) -> dict:
    pid = upload.process.pid
    async with grpc.aio.insecure_channel(upload.address) as channel:
        files = upload_pb2_grpc.FileServiceStub(channel)
        team = await files.CreateFolder(upload_pb2.CreateFolderRequest(name="team"), metadata=ALICE)
        await seed_files(url, team.file_id, changes - 1)
        _, cursor = await catch_up(files, "")
        await files.ShareFile(
            upload_pb2.ShareFileRequest(
                file_id=team.file_id, user_id="bob", role=upload_pb2.ROLE_VIEWER
            ),
            metadata=ALICE,
        )
        feed = await timed(pid, catch_up(files, cursor))
        assert feed[2][0] == changes, feed
        cursor = feed[2][1]
        listing = await timed(pid, relist(files))
        assert listing[2] == changes, listing
        some = (
            await files.ListFolder(
                upload_pb2.ListFolderRequest(folder_id=team.file_id, page_size=few),
                metadata=ALICE,
            )
        ).files
        for n, item in enumerate(some):
            await rename(files, item.file_id, -1 - n)
        few_feed = await timed(pid, catch_up(files, cursor))
        assert few_feed[2][0] == few, few_feed
        cursor = few_feed[2][1]
        few_listing = await timed(pid, relist(files))
        target = some[0].file_id
        wakes, polls = [], []
        for n in range(rounds):
            seconds, cursor = await woken(files, target, cursor, 2 * n)
            wakes.append(seconds)
            seconds, cursor = await polled(files, target, cursor, 2 * n + 1)
            polls.append(seconds)
    return {
        "feed": feed,
        "listing": listing,
        "few_feed": few_feed,
        "few_listing": few_listing,
        "wakes": wakes,
        "polls": polls,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2,000 changes, 5 rounds")
    parser.add_argument("--changes", type=int, default=0, help="default 10,000")
    parser.add_argument("--few", type=int, default=100, help="renames of the everyday case")
    parser.add_argument("--rounds", type=int, default=0, help="wake-up rounds (default 20)")
    parser.add_argument("--postgres", help="admin DSN: run on a fresh PostgreSQL database")
    args = parser.parse_args()
    changes = args.changes or (2_000 if args.quick else 10_000)
    rounds = args.rounds or (5 if args.quick else 20)
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-changes-") as tmp:
        upload, url, label = start_servers(stack, Path(tmp), args.postgres)
        got = asyncio.run(measure(upload, url, changes, args.few, rounds))
    (fw, fc, _), (lw, lc, _) = got["feed"], got["listing"]
    print(f"Change feed, {label}: {changes} changes while the client was away")
    print(
        f"  catch-up (ListChanges, {PAGE}/page)  {fw:7.3f} s  {changes / fw:9.0f} changes/s"
        f"  server CPU {fc * 1e6 / changes:7.1f} us/change"
    )
    print(
        f"  baseline: re-list the view         {lw:7.3f} s  {changes / lw:9.0f} items/s"
        f"    server CPU {lc * 1e6 / changes:7.1f} us/item"
    )
    print(f"  catch-up / re-list throughput ratio: {lw / fw:.2f}x")
    (sw, sc, _), (rw, rc, _) = got["few_feed"], got["few_listing"]
    print(f"Then {args.few} renames: the same client a little behind")
    print(
        f"  catch-up (ListChanges)             {sw * 1000:7.1f} ms  server CPU {sc * 1000:6.1f} ms"
    )
    print(
        f"  baseline: re-list the view         {rw * 1000:7.1f} ms  server CPU {rc * 1000:6.1f} ms"
    )
    print(f"  re-list / catch-up time ratio: {rw / sw:.1f}x")
    wake, poll = statistics.median(got["wakes"]), statistics.median(got["polls"])
    print(f"Commit to wake-up, {rounds} rounds (from sending the rename)")
    print(
        f"  long poll (wait_ms)     p50 {wake * 1000:7.1f} ms"
        f"  max {max(got['wakes']) * 1000:7.1f} ms"
    )
    print(
        f"  baseline: poll each {POLL_SECONDS:.0f} s  p50 {poll * 1000:7.1f} ms"
        f"  max {max(got['polls']) * 1000:7.1f} ms"
    )
    print(f"  poll / long poll p50 ratio: {poll / wake:.1f}x")


if __name__ == "__main__":
    main()
