# ruff: noqa: E402 - the script puts the repository on sys.path before importing it
"""tus benchmark: the same file through the tus endpoint and through one UploadChunks stream.

    .venv/bin/python tests/benchmarks/bench_tus.py [--quick] [--size-mib N] [--rounds N]
        [--postgres postgresql://...]

One upload service process (`python -m services.upload`, its tus endpoint on, SQLite in a
temp folder or a fresh PostgreSQL database, fsync on), a lock service and a private etcd.
The tus client is what browsers and tus-js-client do by default: POST, then the whole file
in one streaming PATCH (aiohttp, read in 1 MiB blocks off the loop), no Upload-Checksum;
its tus chunk size is the gRPC client's chunk size (4 MiB), so both make the same chunks.
The peer, in the same run and the same process: bench_upload's case A (CreateUpload, then
every chunk over one UploadChunks stream, each with its sha256). Ingest is creation to the
last byte acknowledged (PATCH's 204, the stream's answer); end to end waits for COMPLETED.
Rounds interleave the two; the best of each counts; each merged file must hash to the
source. Printed: both rates and tus / gRPC.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests" / "benchmarks")]

import aiohttp
import grpc
from bench_upload import (
    CHANNEL_OPTIONS,
    CHUNK,
    MIB,
    Result,
    Source,
    make_source,
    postgres_database,
    run_serentak_upload,
    send_stream,
    wait_done,
)
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from support.etcd import EtcdServer
from support.ports import free_port
from support.services import service_process

BLOCK = MIB
TUS = "tus (POST + 1 PATCH)"
GRPC = "gRPC (1 UploadChunks stream)"


async def file_blocks(path: Path) -> AsyncIterator[bytes]:
    """The file in 1 MiB blocks, read off the loop."""
    fd = os.open(path, os.O_RDONLY)
    try:
        offset = 0
        while block := await asyncio.to_thread(os.pread, fd, BLOCK, offset):
            yield block
            offset += len(block)
    finally:
        os.close(fd)


async def run_tus(tus_url: str, upload_address: str, source: Source) -> Result:
    """POST, one PATCH of the whole file, then wait for the merge (GetUpload)."""
    name = base64.b64encode(f"tus-{uuid.uuid4().hex[:8]}.bin".encode()).decode()
    headers = {"Tus-Resumable": "1.0.0", "Authorization": "Bearer dev-alice"}
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        started = time.perf_counter()
        async with http.post(
            tus_url,
            headers={
                **headers,
                "Upload-Length": str(source.size),
                "Upload-Metadata": f"filename {name}",
            },
        ) as made:
            if made.status != 201:
                raise RuntimeError(f"tus POST answered {made.status}: {await made.text()}")
            location = made.headers["Location"]
            upload_id = made.headers["Serentak-Upload-Id"]
        async with http.patch(
            tus_url.rsplit("/files/", 1)[0] + location,
            data=file_blocks(source.path),
            headers={
                **headers,
                "Upload-Offset": "0",
                "Content-Type": "application/offset+octet-stream",
                "Content-Length": str(source.size),
            },
        ) as sent:
            if sent.status != 204 or sent.headers["Upload-Offset"] != str(source.size):
                raise RuntimeError(f"tus PATCH answered {sent.status}: {await sent.text()}")
        acked = time.perf_counter()
    async with grpc.aio.insecure_channel(upload_address, options=CHANNEL_OPTIONS) as channel:
        upload = await wait_done(upload_pb2_grpc.UploadServiceStub(channel), upload_id)
    done = time.perf_counter()
    if upload.status != upload_pb2.UPLOAD_STATUS_COMPLETED:
        raise RuntimeError(f"tus: upload ended {upload.status}: {upload.failure_reason}")
    if upload.final_checksum != source.sha256:
        raise RuntimeError("tus: the merged file's checksum differs from the source's")
    merging = upload.merge_finished_at.ToDatetime() - upload.merge_started_at.ToDatetime()
    return Result(done - started, source.size, done - acked, merging.total_seconds())


async def bench(args: argparse.Namespace, tmp: Path) -> None:
    size = (args.size_mib or (128 if args.quick else 1024)) * MIB
    source = await asyncio.to_thread(make_source, tmp / "source.bin", size)
    warmup = await asyncio.to_thread(make_source, tmp / "warmup.bin", 8 * CHUNK)
    with ExitStack() as stack:
        etcd = EtcdServer(tmp / "etcd")
        etcd.start()
        stack.callback(etcd.stop)
        for folder in ("locks", "upload"):
            (tmp / folder).mkdir()
        quiet = {"SERENTAK_LOG_LEVEL": "WARNING"}
        locks = stack.enter_context(
            service_process(
                "locks", tmp / "locks", {**quiet, "SERENTAK_ETCD_ENDPOINT": etcd.endpoint}
            )
        )
        tus_port = free_port()
        env = {
            **quiet,
            "SERENTAK_LOCKS_ADDRESS": locks.address,
            "SERENTAK_NOTIFY_ADDRESS": f"127.0.0.1:{free_port()}",
            "SERENTAK_MAX_TOTAL_CHUNKS": str(max(10_000, size // CHUNK + 1)),
            "SERENTAK_TUS_ENABLED": "true",
            "SERENTAK_TUS_PORT": str(tus_port),
            "SERENTAK_TUS_CHUNK_SIZE": str(CHUNK),
        }
        database = "SQLite (WAL, synchronous FULL)"
        if args.postgres:
            env["SERENTAK_UPLOAD_DATABASE_URL"] = postgres_database(stack, args.postgres)
            database = "PostgreSQL"
        upload = stack.enter_context(service_process("upload", tmp / "upload", env))
        tus_url = f"http://127.0.0.1:{tus_port}/files/"
        await wait_listening(tus_url)

        async def one(case: str, of: Source) -> Result:
            if case == TUS:
                return await run_tus(tus_url, upload.address, of)
            result, _ = await run_serentak_upload(upload.address, of, case, send_stream)
            return result

        for case in (TUS, GRPC):  # first calls import code and fill caches
            await one(case, warmup)
        results: dict[str, list[Result]] = {TUS: [], GRPC: []}
        for _ in range(args.rounds):
            for case in (TUS, GRPC):
                results[case].append(await one(case, source))
    print(f"\n{size // MIB} MiB, {CHUNK // MIB} MiB chunks, {database}, best of {args.rounds}")
    best = {case: max(runs, key=lambda r: r.send_mb_per_s) for case, runs in results.items()}
    for case, r in best.items():
        print(
            f"  {case:32} ingest {r.send_mb_per_s:7.1f} MB/s   end to end {r.mb_per_s:7.1f} MB/s"
            f"   merge {r.merge_seconds or 0:.2f} s"
        )
    print(
        f"  tus / gRPC: ingest {best[TUS].send_mb_per_s / best[GRPC].send_mb_per_s:.2f}x,"
        f" end to end {best[TUS].mb_per_s / best[GRPC].mb_per_s:.2f}x"
    )


async def wait_listening(url: str) -> None:
    """Until the endpoint answers OPTIONS (it starts with the service, after gRPC)."""
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.options(url) as answer:
                    if answer.status == 204:
                        return
            except aiohttp.ClientConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the tus endpoint never listened")
            await asyncio.sleep(0.05)  # polling an observable state with a deadline


def main() -> None:
    """Parse arguments and run in a temp folder."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="128 MiB instead of 1 GiB")
    parser.add_argument("--size-mib", type=int, default=None, help="source size in MiB")
    parser.add_argument("--postgres", metavar="DSN", help="upload database on this server")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (best kept)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tus-") as tmp:
        asyncio.run(bench(args, Path(tmp)))


if __name__ == "__main__":
    main()
