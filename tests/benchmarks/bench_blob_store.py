# ruff: noqa: E402 - the script puts the repository on sys.path before importing it
"""Blob store benchmark: upload + merge of one file through the S3 store vs the local store.

    .venv/bin/python tests/benchmarks/bench_blob_store.py [--quick] [--size-mib N] [--rounds N]

One run starts a private etcd, `python -m services.locks`, a real S3-compatible server
(s3s-fs, its data on the same file system as the local store) and two upload services
(`python -m services.upload`, SQLite, fsync on): one on the local store, one with
SERENTAK_BLOB_URL=s3://... Each case sends the file in 4 MiB chunks (4 parallel PutChunk
senders, as in bench_upload.py) and is timed from CreateUpload to GetUpload answering
COMPLETED, so it includes the merge (chunk objects streamed through merge_core's
StreamingMerge into a multipart upload on S3; merge_core's file merge locally).

Baseline, in the same run: a bare obstore put of the same file to the same server (one
multipart upload, the same part size and concurrency as the store's merge). The S3
service writes every byte twice (the chunk PUTs, then the merged object), so about 2x the
bare put is the floor of the design; the ratio says how close it gets. The other design,
chunks as parts of one multipart upload begun at CreateUpload (possible only for chunks
of at least 5 MiB), would still read the file back once for the whole-file checksum: its
floor, the bare put plus a timed read-back, is printed too. Every merged
object's sha256 is read back and must equal the source's, or the run fails.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests/benchmarks")]

import obstore
from bench_upload import (
    CHUNK,
    MIB,
    SENDERS,
    Result,
    Source,
    make_source,
    run_serentak_upload,
    send_parallel,
)
from support.etcd import EtcdServer
from support.ports import free_port
from support.s3 import S3Server
from support.services import service_process

from services.upload.settings import UploadSettings
from services.upload.storage.blob_store import content_key, open_blob_store

PART_SIZE = 8 * MIB  # UploadSettings.s3_part_size default
CONCURRENCY = 4  # UploadSettings.s3_merge_concurrency default
LOCAL_CASE = "service, local store"
S3_CASE = "service, S3 store"
BARE_CASE = "bare obstore put (multipart)"
READ_BACK: list[float] = []  # seconds to read the bare object back and sha256 it


async def stored_sha256(settings: UploadSettings, key: str) -> str:
    """sha256 of the object under `key`, read back through the service's own store."""
    store = open_blob_store(settings)
    digest = hashlib.sha256()
    async for block in store.iter_read(key, 0, 8 * MIB):
        digest.update(block)
    await store.close()
    return digest.hexdigest()


async def run_service(address: str, settings: UploadSettings, source: Source, case: str) -> Result:
    """One upload + merge through a running upload service; the merged bytes verified."""
    result, upload = await run_serentak_upload(address, source, case, send_parallel)
    key = content_key(upload.file_id, upload.upload_id)
    if await stored_sha256(settings, key) != source.sha256:
        raise RuntimeError(f"{case}: the stored file differs from the source")
    return result


async def run_bare_put(server: S3Server, source: Source, n: int) -> Result:
    """obstore put of the source file to the same server, as one multipart upload."""
    settings = UploadSettings(**server.upload_settings(f"bare-{n}"))
    store = open_blob_store(settings)
    raw = store._store  # type: ignore[attr-defined]  # the bare client is the point here
    started = time.perf_counter()
    await obstore.put_async(
        raw, "bare.bin", source.path, chunk_size=PART_SIZE, max_concurrency=CONCURRENCY
    )
    seconds = time.perf_counter() - started
    # The read-back is what the other design (chunks as parts of one multipart upload
    # begun at CreateUpload) would still need for the whole-file checksum: timed too.
    started = time.perf_counter()
    if await stored_sha256(settings, "bare.bin") != source.sha256:
        raise RuntimeError("bare put: the stored object differs from the source")
    READ_BACK.append(time.perf_counter() - started)
    await store.delete("bare.bin")
    return Result(seconds, source.size)


async def bench(args: argparse.Namespace, tmp: Path) -> None:
    """Start everything, run interleaved rounds, print the best run of each case."""
    with ExitStack() as stack:
        source = make_source(tmp / "source.bin", args.size_mib * MIB)
        stack.callback(source.path.unlink)
        etcd = EtcdServer(tmp / "etcd")
        etcd.start()
        stack.callback(etcd.stop)
        s3 = S3Server(tmp / "s3")
        s3.start()
        stack.callback(s3.stop)
        quiet = {"SERENTAK_LOG_LEVEL": "WARNING"}
        locks_dir, local_dir, s3_dir = tmp / "locks", tmp / "local", tmp / "s3svc"
        for folder in (locks_dir, local_dir, s3_dir):
            folder.mkdir()
        locks = stack.enter_context(
            service_process("locks", locks_dir, {**quiet, "SERENTAK_ETCD_ENDPOINT": etcd.endpoint})
        )
        common = {
            **quiet,
            "SERENTAK_LOCKS_ADDRESS": locks.address,
            "SERENTAK_NOTIFY_ADDRESS": f"127.0.0.1:{free_port()}",
            "SERENTAK_PUBLISH_EVENTS": "false",
            "SERENTAK_MAX_TOTAL_CHUNKS": str(max(10_000, source.chunks)),
        }
        s3_env = s3.env("service")
        local = stack.enter_context(service_process("upload", local_dir, common))
        remote = stack.enter_context(service_process("upload", s3_dir, {**common, **s3_env}))
        local_settings = UploadSettings(data_dir=local_dir / "data")
        s3_settings = UploadSettings(**s3.upload_settings("service"))
        print(f"source: {args.size_mib} MiB, sha256 {source.sha256[:16]}...", flush=True)
        results: dict[str, list[Result]] = {BARE_CASE: [], LOCAL_CASE: [], S3_CASE: []}
        for n in range(args.rounds):
            results[BARE_CASE].append(await run_bare_put(s3, source, n))
            results[LOCAL_CASE].append(
                await run_service(local.address, local_settings, source, LOCAL_CASE)
            )
            results[S3_CASE].append(await run_service(remote.address, s3_settings, source, S3_CASE))
            line = ", ".join(f"{case} {r[-1].mb_per_s:.1f}" for case, r in results.items())
            print(f"  round {n + 1}: MB/s {line}", flush=True)
        print_table(results, source.size)


def print_table(results: dict[str, list[Result]], size: int) -> None:
    """Best run of each case; the S3 service against the local service and the bare put."""
    best = {case: min(runs, key=lambda r: r.seconds) for case, runs in results.items()}
    print(
        f"\nblob store benchmark: {size / MIB:.0f} MiB in {CHUNK // MIB} MiB chunks, "
        f"PutChunk x{SENDERS}, SQLite, s3s-fs on 127.0.0.1; merged parts of "
        f"{PART_SIZE // MIB} MiB x{CONCURRENCY} in flight"
    )
    head = f"{'case (best run)':<30} {'wall s':>7} {'MB/s':>7} {'merging s':>9}"
    print(head)
    print("-" * len(head))
    for case, r in best.items():
        merge = f"{r.merge_seconds:>9.3f}" if r.merge_seconds is not None else " " * 9
        print(f"{case:<30} {r.seconds:>7.2f} {r.mb_per_s:>7.1f} {merge}")
    s3, local, bare = best[S3_CASE], best[LOCAL_CASE], best[BARE_CASE]
    print(
        f"S3 store / local store: {s3.seconds / local.seconds:.2f}x the time "
        f"(merge {s3.merge_seconds or 0:.2f} s vs {local.merge_seconds or 0:.2f} s)"
    )
    print(f"S3 store upload+merge / bare obstore put: {s3.seconds / bare.seconds:.2f}x the time")
    floor = bare.seconds + min(READ_BACK)
    print(
        f"floor of chunks-as-multipart-parts (needs chunks >= 5 MiB): bare put + one read-back "
        f"for the whole-file checksum = {floor:.2f} s; S3 store / that: {s3.seconds / floor:.2f}x"
    )
    print("every stored file verified: sha256 read back equals the source")


def main() -> None:
    """Parse arguments and run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="128 MiB instead of 1 GiB")
    parser.add_argument("--size-mib", type=int, default=None, help="source size in MiB")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds (best kept)")
    args = parser.parse_args()
    if args.size_mib is None:
        args.size_mib = 128 if args.quick else 1024
    with tempfile.TemporaryDirectory(prefix="bench_blob_store_") as tmp:
        asyncio.run(bench(args, Path(tmp)))


if __name__ == "__main__":
    main()
