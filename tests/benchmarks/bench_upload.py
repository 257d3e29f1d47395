# ruff: noqa: E402 - the script puts the repository on sys.path before importing it
"""Upload benchmark: one client sends a file in 4 MiB chunks; MB/s end to end, with merge.

    .venv/bin/python tests/benchmarks/bench_upload.py [--quick] [--size-mib N] [--rounds N]
        [--postgres postgresql://...]

Servers are processes of their own (the client and the servers use different cores): a
private etcd, `python -m services.locks`, `python -m services.upload` (SQLite in a temp
folder, or a fresh PostgreSQL database with `--postgres`), fsync on. Two shapes: A. one
UploadChunks stream; B. 4 parallel PutChunk senders.

Baseline, in the same run and with the same client code: a bare grpc.aio server (below, its
own process) that does for each chunk what any correct server must: check its sha256, write
it to a file of its own, fsync the file and its folder, answer (a stream RPC for A, a unary
one for B). The ratio is Serentak's ingest rate (CreateUpload -> last chunk acknowledged)
over the bare server's for the same shape: what the upload service adds per chunk (auth,
chunk rows and counters in the database, the commit). The merge has no bare counterpart:
it is printed on its own line (and end to end, until GetUpload answers COMPLETED). Rounds
interleave bare and Serentak per shape; the best run counts. Then one more run of each
shape per server, bare's two and then Serentak's two, so each server has as many runs as
the other and exactly one parallel run right after its own stream run (a run after the
same server's run measured faster than one after the other server's: a bare server's
extra run alone, as before, was its best parallel run in most runs of this benchmark).
The bare server's chunk files and each merged blob must equal the source or the run fails.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import grpc
import psycopg
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from sqlalchemy.engine import make_url
from support.etcd import EtcdServer
from support.ports import free_port
from support.services import service_process

from services.common.config import CommonSettings
from services.common.malloc_tuning import retain_freed_memory
from services.upload.storage.blob_store import content_key

MIB = 1024 * 1024
CHUNK = 4 * MIB
SENDERS = 4
WARMUP_CHUNKS = 8
POLL_S = 0.01  # resolution of "ack -> completed"
READ_AHEAD = 2  # chunks read and hashed ahead of the stream
# A 1 GiB merge takes seconds; far longer means it failed for good (e.g. dead-lettered).
MERGE_DEADLINE_S = 120.0
BARE_SERVICE = "serentak.bench.v1.BareSink"
MD = (("authorization", "Bearer dev-alice"),)
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 * MIB),
    ("grpc.max_receive_message_length", 64 * MIB),
]


# --- the bare baseline server (runs as `bench_upload.py --bare-server PORT DIR`) ---


def bare_store(out_dir: Path, request: upload_pb2.PutChunkRequest) -> str:
    """What any correct chunk server must do, nothing more: check the chunk's sha256, write
    it to a file of its own (0600, never overwriting) and make it durable: fsync the file,
    then its folder (the new name) before answering. Runs on a worker thread."""
    data = request.data
    if hashlib.sha256(data).hexdigest() != request.checksum:
        raise ValueError(f"chunk {request.chunk_index}: checksum mismatch")
    folder = out_dir / request.upload_id
    path = folder / str(request.chunk_index)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return str(path)


async def serve_bare(port: int, out_dir: Path) -> None:
    """A grpc.aio server with the honest minimum per chunk (`bare_store`, off the event loop):
    `Write` takes a stream of chunks (stored in order, like UploadChunks), `Put` one chunk
    (like PutChunk). Chunks land in `out_dir/{upload_id}/{index}`."""

    async def write(requests: AsyncIterator[upload_pb2.PutChunkRequest], _ctx: object) -> bytes:
        count = 0
        async for request in requests:
            if count == 0:
                (out_dir / request.upload_id).mkdir(exist_ok=True)
            await asyncio.to_thread(bare_store, out_dir, request)
            count += 1
        return str(count).encode()

    async def put(request: upload_pb2.PutChunkRequest, _ctx: object) -> bytes:
        (out_dir / request.upload_id).mkdir(exist_ok=True)
        return (await asyncio.to_thread(bare_store, out_dir, request)).encode()

    handlers = {
        "Write": grpc.stream_unary_rpc_method_handler(
            write, request_deserializer=upload_pb2.PutChunkRequest.FromString
        ),
        "Put": grpc.unary_unary_rpc_method_handler(
            put, request_deserializer=upload_pb2.PutChunkRequest.FromString
        ),
    }
    # The allocator setting every Serentak process starts with (SERENTAK_MALLOC_RETAIN_BYTES's
    # default): a property of the process, not work per chunk, so the baseline gets it too.
    retain_freed_memory(CommonSettings().malloc_retain_bytes)
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(BARE_SERVICE, handlers)])
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


def start_bare(out_dir: Path) -> tuple[subprocess.Popen[str], str]:
    """Start the bare server process; returns it and its address once it is listening."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, __file__, "--bare-server", str(port), str(out_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        process.kill()
        raise RuntimeError("the bare server did not start")
    return process, f"127.0.0.1:{port}"


# --- the client side, shared by every case ---


@dataclass(frozen=True)
class Source:
    """The file to upload, its size and sha256."""

    path: Path
    size: int
    sha256: str

    @property
    def chunks(self) -> int:
        """How many 4 MiB chunks it makes."""
        return max(1, -(-self.size // CHUNK))


def make_source(path: Path, size: int) -> Source:
    """Write `size` random bytes to `path` (hashing them on the way)."""
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for offset in range(0, size, CHUNK):
            block = os.urandom(min(CHUNK, size - offset))
            digest.update(block)
            f.write(block)
    return Source(path, size, digest.hexdigest())


def read_chunk(fd: int, upload_id: str, index: int) -> upload_pb2.PutChunkRequest:
    """Chunk `index` of the source as a request carrying its sha256 (what any client does)."""
    data = os.pread(fd, CHUNK, index * CHUNK)
    return upload_pb2.PutChunkRequest(
        upload_id=upload_id,
        chunk_index=index,
        data=data,
        checksum=hashlib.sha256(data).hexdigest(),
    )


async def read_ahead(
    fd: int, upload_id: str, count: int
) -> AsyncIterator[upload_pb2.PutChunkRequest]:
    """Chunks 0..count-1 in order; reading and hashing (off the loop) run ahead of sending."""
    queue: asyncio.Queue[upload_pb2.PutChunkRequest] = asyncio.Queue(maxsize=READ_AHEAD)

    async def produce() -> None:
        for index in range(count):
            await queue.put(await asyncio.to_thread(read_chunk, fd, upload_id, index))

    producer = asyncio.create_task(produce())
    try:
        for _ in range(count):
            yield await queue.get()
        await producer
    finally:
        producer.cancel()


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in 4 MiB blocks, leaving none of them in the page cache.

    Why drop them: the merged blob is written with drop-behind, so reading it back fills
    1 GiB of page cache that would stay. On this VM a page cache page that is not a
    recently freed one faults in from the host, so every run after a Serentak run (of
    either server) then wrote its chunks ~1.5x slower in the kernel (perf: the write's
    copy into page cache 27% vs 7% of samples) -- the verification, not the server,
    decided the next run's rate."""
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        offset = 0
        while block := os.pread(fd, CHUNK, offset):
            digest.update(block)
            os.posix_fadvise(fd, offset, len(block), os.POSIX_FADV_DONTNEED)
            offset += len(block)
    finally:
        os.close(fd)
    return digest.hexdigest()


@dataclass
class Result:
    """One measured run."""

    seconds: float
    size: int
    ack_to_completed: float | None = None
    merge_seconds: float | None = None
    # The server process's CPU seconds while ingesting (until the last acknowledgement).
    server_cpu: float | None = None

    @property
    def mb_per_s(self) -> float:
        """Throughput in MB/s (10^6 bytes)."""
        return self.size / self.seconds / 1e6

    @property
    def send_seconds(self) -> float:
        """Time until the last chunk's acknowledgement (the merge not included)."""
        return self.seconds - (self.ack_to_completed or 0.0)

    @property
    def send_mb_per_s(self) -> float:
        """Throughput until the last chunk's acknowledgement (the merge not included)."""
        return self.size / self.send_seconds / 1e6


def check_bare_output(folder: Path, source: Source) -> None:
    """The bare server's chunk files, in index order, must hold the source's bytes; they
    are removed afterwards."""
    digest = hashlib.sha256()
    try:
        for index in range(source.chunks):
            digest.update((folder / str(index)).read_bytes())
        if digest.hexdigest() != source.sha256:
            raise RuntimeError("the bare server wrote other bytes than the source")
    finally:
        shutil.rmtree(folder)


class BareStub:
    """The bare server's two RPCs under the upload stub's names, so the same senders drive
    both servers."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        serialize = upload_pb2.PutChunkRequest.SerializeToString
        self.UploadChunks = channel.stream_unary(
            f"/{BARE_SERVICE}/Write", request_serializer=serialize
        )
        self.PutChunk = channel.unary_unary(f"/{BARE_SERVICE}/Put", request_serializer=serialize)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process (every thread) has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_bare(
    address: str, out_dir: Path, source: Source, send: Sender, pid: int | None = None
) -> Result:
    """Send the source to the bare server with `send`; time to the last answer (every chunk
    checked and fsynced); verify the stored bytes."""
    fd = os.open(source.path, os.O_RDONLY)
    upload_id = uuid.uuid4().hex
    try:
        async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as ch:
            await ch.channel_ready()
            cpu = cpu_seconds(pid) if pid else 0.0
            started = time.perf_counter()
            await send(BareStub(ch), fd, upload_id, source.chunks)  # type: ignore[arg-type]
            seconds = time.perf_counter() - started
            cpu = cpu_seconds(pid) - cpu if pid else 0.0
    finally:
        os.close(fd)
    await asyncio.to_thread(check_bare_output, out_dir / upload_id, source)
    return Result(seconds, source.size, server_cpu=cpu if pid else None)


async def send_stream(
    stub: upload_pb2_grpc.UploadServiceStub, fd: int, upload_id: str, count: int
) -> None:
    """Case A: every chunk over one UploadChunks stream."""
    await stub.UploadChunks(read_ahead(fd, upload_id, count), metadata=MD)


async def send_parallel(
    stub: upload_pb2_grpc.UploadServiceStub, fd: int, upload_id: str, count: int
) -> None:
    """Case B: SENDERS concurrent PutChunk loops taking indexes from a shared queue."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(count):
        queue.put_nowait(index)

    async def sender() -> None:
        while not queue.empty():
            index = queue.get_nowait()
            request = await asyncio.to_thread(read_chunk, fd, upload_id, index)
            await stub.PutChunk(request, metadata=MD)

    await asyncio.gather(*(sender() for _ in range(SENDERS)))


Sender = Callable[[upload_pb2_grpc.UploadServiceStub, int, str, int], Awaitable[None]]


async def run_serentak(
    address: str, blob_root: Path, source: Source, case: str, send: Sender, pid: int | None
) -> Result:
    """CreateUpload, send every chunk with `send`, wait for COMPLETED; verify the blob."""
    result, upload = await run_serentak_upload(address, source, case, send, pid)
    blob = blob_root / content_key(upload.file_id, upload.upload_id)
    stored = await asyncio.to_thread(file_sha256, blob)
    if stored != source.sha256:
        raise RuntimeError(f"{case}: the merged file differs from the source")
    return result


async def run_serentak_upload(
    address: str, source: Source, case: str, send: Sender, pid: int | None = None
) -> tuple[Result, upload_pb2.Upload]:
    """CreateUpload, send every chunk with `send`, wait for COMPLETED (checksum checked);
    with the server's `pid`, its CPU time until the last chunk is acknowledged."""
    fd = os.open(source.path, os.O_RDONLY)
    try:
        async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as ch:
            stub = upload_pb2_grpc.UploadServiceStub(ch)
            await ch.channel_ready()
            cpu = cpu_seconds(pid) if pid else 0.0
            started = time.perf_counter()
            created = await stub.CreateUpload(
                upload_pb2.CreateUploadRequest(
                    client_request_id=uuid.uuid4().hex,
                    new_file=upload_pb2.NewFileTarget(name=f"bench-{uuid.uuid4().hex[:8]}.bin"),
                    total_chunks=source.chunks,
                    total_size=source.size,
                    chunk_size=CHUNK,
                ),
                metadata=MD,
            )
            await send(stub, fd, created.upload_id, source.chunks)
            acked = time.perf_counter()
            cpu = cpu_seconds(pid) - cpu if pid else 0.0
            upload = await wait_done(stub, created.upload_id)
            done = time.perf_counter()
    finally:
        os.close(fd)
    if upload.status != upload_pb2.UPLOAD_STATUS_COMPLETED:
        raise RuntimeError(f"{case}: upload ended {upload.status}: {upload.failure_reason}")
    if upload.final_checksum != source.sha256:
        raise RuntimeError(f"{case}: the merged file's checksum differs from the source's")
    merging = upload.merge_finished_at.ToDatetime() - upload.merge_started_at.ToDatetime()
    result = Result(done - started, source.size, done - acked, merging.total_seconds())
    result.server_cpu = cpu if pid else None
    return result, upload


async def wait_done(stub: upload_pb2_grpc.UploadServiceStub, upload_id: str) -> upload_pb2.Upload:
    """Poll GetUpload until the upload is COMPLETED or FAILED (there is no watch RPC)."""
    deadline = time.monotonic() + MERGE_DEADLINE_S
    final = (upload_pb2.UPLOAD_STATUS_COMPLETED, upload_pb2.UPLOAD_STATUS_FAILED)
    while True:
        upload = await stub.GetUpload(upload_pb2.GetUploadRequest(upload_id=upload_id), metadata=MD)
        if upload.status in final:
            return upload
        if time.monotonic() > deadline:
            raise RuntimeError(f"upload {upload_id} stuck in {upload.status}")
        await asyncio.sleep(POLL_S)  # polling an observable state with a deadline


# --- orchestration ---


def postgres_database(stack: ExitStack, admin_dsn: str) -> str:
    """A fresh database on `admin_dsn`'s server, dropped when `stack` closes; its URL."""
    name = f"serentak_bench_upload_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    stack.callback(drop)
    url = make_url(admin_dsn).set(drivername="postgresql+psycopg", database=name)
    return url.render_as_string(hide_password=False)


@dataclass
class Servers:
    """Addresses of the running servers and where the upload service keeps its blobs."""

    upload: str
    bare: str
    bare_dir: Path
    blob_root: Path
    database: str
    upload_log: Path
    upload_pid: int
    bare_pid: int


def start_servers(stack: ExitStack, tmp: Path, postgres: str | None, chunks: int) -> Servers:
    """etcd, `python -m services.locks`, `python -m services.upload` and the bare server."""
    etcd = EtcdServer(tmp / "etcd")
    etcd.start()
    stack.callback(etcd.stop)
    for folder in ("locks", "upload", "bare"):
        (tmp / folder).mkdir()
    quiet = {"SERENTAK_LOG_LEVEL": "WARNING"}
    locks_env = {**quiet, "SERENTAK_ETCD_ENDPOINT": etcd.endpoint}
    locks = stack.enter_context(service_process("locks", tmp / "locks", locks_env))
    upload_env = {
        **quiet,
        "SERENTAK_LOCKS_ADDRESS": locks.address,
        # Nothing listens there: the upload service must not reach anyone else's notify.
        "SERENTAK_NOTIFY_ADDRESS": f"127.0.0.1:{free_port()}",
        "SERENTAK_MAX_TOTAL_CHUNKS": str(max(10_000, chunks)),
    }
    database = "SQLite (WAL, synchronous FULL)"
    if postgres:
        upload_env["SERENTAK_UPLOAD_DATABASE_URL"] = postgres_database(stack, postgres)
        database = "PostgreSQL"
    upload = stack.enter_context(service_process("upload", tmp / "upload", upload_env))
    bare, bare_address = start_bare(tmp / "bare")
    stack.callback(bare.wait)
    stack.callback(bare.terminate)
    blobs = tmp / "upload" / "data" / "blobs"
    return Servers(
        upload.address,
        bare_address,
        tmp / "bare",
        blobs,
        database,
        upload.log_path,
        upload.process.pid,
        bare.pid,
    )


STREAM = "1 stream (UploadChunks)"
PARALLEL = f"{SENDERS} parallel PutChunk"
SERENTAK = "Serentak"
BARE = "bare"


async def measure(
    servers: Servers, source: Source, warmup: Source, rounds: int
) -> dict[tuple[str, str], list[Result]]:
    """A warm-up upload of each shape to each server (first calls import code and fill
    caches), interleaved rounds (bare then Serentak, 1 stream then parallel), then one more
    run of each shape, bare's then Serentak's; every result, keyed by (server, shape)."""
    shapes: tuple[tuple[str, Sender], ...] = ((STREAM, send_stream), (PARALLEL, send_parallel))
    for shape, send in shapes:
        await run_bare(servers.bare, servers.bare_dir, warmup, send)
        await run_serentak(servers.upload, servers.blob_root, warmup, shape, send, None)
    results: dict[tuple[str, str], list[Result]] = {
        (server, shape): [] for shape, _ in shapes for server in (BARE, SERENTAK)
    }
    for n in range(rounds):
        for shape, send in shapes:
            results[BARE, shape].append(
                await run_bare(servers.bare, servers.bare_dir, source, send, servers.bare_pid)
            )
            results[SERENTAK, shape].append(
                await run_serentak(
                    servers.upload, servers.blob_root, source, shape, send, servers.upload_pid
                )
            )
        line = ", ".join(f"{a} {b} {r[-1].mb_per_s:.1f}" for (a, b), r in results.items())
        print(f"  round {n + 1}: MB/s {line}", flush=True)
    for shape, send in shapes:
        results[BARE, shape].append(
            await run_bare(servers.bare, servers.bare_dir, source, send, servers.bare_pid)
        )
    for shape, send in shapes:
        results[SERENTAK, shape].append(
            await run_serentak(
                servers.upload, servers.blob_root, source, shape, send, servers.upload_pid
            )
        )
    return results


def print_table(results: dict[tuple[str, str], list[Result]], size: int, database: str) -> None:
    """The best run of each case; Serentak's ingest (CreateUpload -> last chunk acknowledged)
    against the bare server's best run of the same shape, and the merge on its own line."""
    best = {case: min(runs, key=lambda r: r.send_seconds) for case, runs in results.items()}
    print(f"\nupload benchmark: {size / MIB:.0f} MiB in {CHUNK // MIB} MiB chunks, {database}")
    head = (
        f"{'case (best run)':<34} {'ingest s':>8} {'MB/s':>7} {'vs bare':>8} "
        f"{'e2e MB/s':>8} {'e2e vs bare':>11} {'CPU ms/chunk':>12}  ingest MB/s of every run"
    )
    print(head)
    print("-" * len(head))
    for (server, shape), r in best.items():
        bare = best[BARE, shape]
        runs = " ".join(f"{x.send_mb_per_s:.1f}" for x in results[server, shape])
        cpu_per_chunk = (r.server_cpu or 0.0) * 1000 / (size / CHUNK)
        print(
            f"{server + ' ' + shape:<34} {r.send_seconds:>8.2f} {r.send_mb_per_s:>7.1f} "
            f"{r.send_mb_per_s / bare.send_mb_per_s:>8.2f} {r.mb_per_s:>8.1f} "
            f"{r.mb_per_s / bare.mb_per_s:>11.2f} {cpu_per_chunk:>12.1f}  {runs}"
        )
    for shape in (STREAM, PARALLEL):
        r = best[SERENTAK, shape]
        print(
            f"merge after {shape}: {r.merge_seconds or 0.0:.3f} s on the server "
            f"(last ack -> COMPLETED seen {r.ack_to_completed or 0.0:.3f} s)"
        )
    print(
        "ingest: first request -> last chunk acknowledged (bare: every chunk's sha256 checked, "
        "written to its own file, file and folder fsynced; Serentak: CreateUpload + chunks); "
        f"e2e: Serentak until GetUpload answers COMPLETED (polled every {POLL_S * 1000:.0f} ms)"
    )
    print("CPU ms/chunk: the server process's CPU time (all threads) while ingesting, per chunk")
    print("every stored file verified: bare chunk files and Serentak's merged blob = the source")


async def bench(args: argparse.Namespace, tmp: Path) -> None:
    """Make the source, start the servers, run every case, print the table."""
    with ExitStack() as stack:
        source = make_source(tmp / "source.bin", args.size_mib * MIB)
        stack.callback(source.path.unlink)
        warmup = make_source(tmp / "warmup.bin", WARMUP_CHUNKS * CHUNK)
        stack.callback(warmup.path.unlink)
        servers = start_servers(stack, tmp, args.postgres, source.chunks)
        print(f"source: {args.size_mib} MiB, sha256 {source.sha256[:16]}...", flush=True)
        try:
            results = await measure(servers, source, warmup, args.rounds)
        except RuntimeError:
            log = servers.upload_log.read_text(errors="replace")
            print(f"upload service log (last lines):\n{log[-4000:]}", file=sys.stderr)
            raise
        print_table(results, source.size, servers.database)


def main() -> None:
    """Parse arguments; run the benchmark (or, internally, the bare server)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="128 MiB instead of 1 GiB")
    parser.add_argument("--size-mib", type=int, default=None, help="source size in MiB")
    parser.add_argument("--postgres", metavar="DSN", help="upload database on this server")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds (best kept)")
    parser.add_argument("--bare-server", nargs=2, metavar=("PORT", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_server:
        asyncio.run(serve_bare(int(args.bare_server[0]), Path(args.bare_server[1])))
        return
    if args.size_mib is None:
        args.size_mib = 128 if args.quick else 1024
    # Servers and baseline write under one temporary folder, so they share one file system.
    with tempfile.TemporaryDirectory(prefix="bench_upload_") as tmp:
        asyncio.run(bench(args, Path(tmp)))


if __name__ == "__main__":
    main()
