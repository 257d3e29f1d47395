# ruff: noqa: E402 - the script puts the repository on sys.path before importing it
"""Small files: the SDK's `upload(path)` end to end vs a PUT of the same files into s3s-fs.

    .venv/bin/python tests/benchmarks/bench_small_files.py [--quick] [--path auto|chunks]
        [--postgres DSN] [--sqlite-only | --postgres-only] [--sizes 4k,64k,1m]
        [--concurrency 1,16,64] [--stages]
        [--py-spy DIR] [--lean-plumbing none|sessions|rpc]

The stack as `make run` starts it, each service its own process: a private etcd, then
`python -m services.locks`, `services.notify` and `services.upload` (SQLite, local blobs,
fsync on, events published to notify), all with their data in a temp folder; and the
same again on PostgreSQL (fresh upload and notify databases) with `--postgres DSN` or
SERENTAK_TEST_PG_DSN. Only the write rate limit is lifted (a guard against abuse, 6,000
writes a minute per user by default: a full run makes more).

Serentak: one `SerentakClient` (one channel, as an application has), `concurrency`
workers each uploading distinct files one after another, every one a new file. A file's
latency runs from the call until the SDK hands back the completed upload (committed
version and whole-file checksum in hand, checked against the source). `--path auto` is
`SerentakClient.upload(path)`, the SDK's own choice of RPCs (a file that fits one chunk:
one UploadFile, answered once its version is committed); `--path chunks` the chunked
building blocks (`create_upload`, `send_missing`, `wait_finished`: CreateUpload, PutChunk,
then GetUpload waiting on the server until the merge commits).

The peer, in the same run: the same files with the same concurrency PUT into s3s-fs
(started here on 127.0.0.1, its folder on the same file system) through obstore, one PUT
per file, timed until obstore answers. s3s-fs 0.14.1 writes each object to a temp file
and renames it into place without any fsync (its source; the durability probe below
counts the calls), so a PUT's answer means "in the page cache". The fsync-matched peer
is the same PUT followed by fsync of the object file and of its folder (done here, on a
thread of its own, before the file counts as done): durable as Serentak's answer is
(chunk and merged file fsynced, SQLite synchronous FULL / PostgreSQL commit), minus
s3s-fs's small metadata file, which nothing fsyncs.

The table: per (database, size, concurrency), files/s, p50 and p99 (nearest rank; with
fewer than 100 files p99 is the slowest) of Serentak and both peers, and the ratios
(files/s Serentak/peer; p50 Serentak/peer). Verdicts against the issue's goals: at 64 KiB
x16, files/s >= 0.5x the peer's and p50 <= 3x the peer's; one 64 KiB file alone, p50 <=
10 ms. A case starts no new file after its time budget, so counts are bounded in both.
Two Python servers run the same cases with the SDK's client code, as bounds: the floor
(`small_files_floor.py`: a bare grpc.aio server that checks, writes, fsyncs and group-commits
four rows a file, nothing of Serentak's) and the lean floor (`small_files_lean.py`: Serentak's
reads and writes for a new file, its checks, log line and metrics, written as one pass a
group in plain SQL: what a lean rewrite of the small-file path would reach here).
The last table is the machine's budget at the throughput goal: the CPU a file this
machine can give when files are done at 0.5x the PUT's rate with every core busy, beside
what the PUT, the floors and Serentak each spend a file, their clients included (all run
on the same cores). A side spending more than the budget cannot reach the goal's rate here.
`--lean-plumbing sessions|rpc` runs the lean floor's work on Serentak's own plumbing
instead (`small_files_lean_infra.py`, SQLite only): what the plumbing costs, and so what is
left to the small-file path's own code. `--stages` prints, per case, the upload service's
own timings from its JSON log (rpc_completed per method, merge job pick-up lag, merge,
lock, commit, GetUpload calls per file); `--py-spy DIR` records the upload service under
py-spy during each case.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "client"), str(REPO / "tests")]

import obstore
import psycopg
from benchmarks.small_files_floor import Floor
from obstore.store import S3Store
from serentak.sdk import SerentakClient
from serentak.upload.v1 import upload_pb2
from sqlalchemy.engine import make_url
from support.etcd import EtcdServer
from support.s3 import S3Server
from support.services import ServiceProcess, service_process

KIB = 1024
MIB = 1024 * KIB
SIZES = {"4k": 4 * KIB, "64k": 64 * KIB, "1m": MIB}
TOKEN = "dev-alice"
# Files per case (the most; the time budget may stop a case earlier) by concurrency.
FILES = {1: 40, 16: 96, 64: 192}
QUICK_FILES = {1: 12, 16: 32, 64: 64}
BUDGET_S = 20.0  # no new file starts after this long in one case
QUICK_BUDGET_S = 6.0
WARMUP_FILES = 4
CASE_DEADLINE_S = 300.0  # a case still running then has failed (a stuck merge)
GOAL_CASE_THROUGHPUT = ("64k", 16)  # files/s >= 0.5x the peer's, p50 <= 3x the peer's
GOAL_CASE_ALONE = ("64k", 1)  # p50 <= 10 ms
GOAL_RATIO, GOAL_P50_RATIO, GOAL_ALONE_MS = 0.5, 3.0, 10.0
SERENTAK, PUT, PUT_FSYNC, FLOOR = "Serentak", "PUT", "PUT+fsync", "floor"
LEAN = "lean floor"
# The lean floor, and the same work on Serentak's plumbing (`--lean-plumbing`).
LEAN_SCRIPTS = {
    "none": ("small_files_lean.py",),
    "sessions": ("small_files_lean_infra.py",),
    "rpc": ("small_files_lean_infra.py", "--rpc"),
}
# The fsync family: what makes a write durable (sync_file_range alone does not).
SYNC_CALLS = "fsync,fdatasync,sync_file_range,syncfs,sync"


# --- the files ---


@dataclass(frozen=True)
class Source:
    """One file to upload: where it is, its size and sha256."""

    path: Path
    size: int
    sha256: str


def make_sources(folder: Path, label: str, size: int, count: int) -> list[Source]:
    """`count` distinct files of `size` random bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    sources = []
    for i in range(count):
        data = os.urandom(size)
        path = folder / f"{label}-{i:04d}.bin"
        path.write_bytes(data)
        sources.append(Source(path, size, hashlib.sha256(data).hexdigest()))
    return sources


# --- running a case: `concurrency` workers, bounded in files and in time ---


@dataclass
class Run:
    """The per-file latencies and wall time of one case on one side."""

    latencies: list[float] = field(default_factory=list)
    wall: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds per server process
    client_cpu: float = 0.0  # CPU seconds of this process (the client side) meanwhile

    @property
    def files(self) -> int:
        """Files done."""
        return len(self.latencies)

    @property
    def rate(self) -> float:
        """Files per second over the case's wall time."""
        return self.files / self.wall if self.wall else 0.0

    def pct(self, q: float) -> float:
        """The q-th percentile latency in ms (nearest rank)."""
        ordered = sorted(self.latencies)
        rank = max(1, -(-len(ordered) * q // 100))
        return ordered[int(rank) - 1] * 1000


async def run_case(
    sources: list[Source],
    concurrency: int,
    budget_s: float,
    one: Callable[[int, Source], Awaitable[None]],
) -> Run:
    """`concurrency` workers call `one` on the sources in turn (each source at most once),
    starting none after `budget_s`; every call's latency and the wall time."""
    run = Run()
    queue = list(enumerate(sources))
    queue.reverse()
    started = time.perf_counter()
    stop_at = started + budget_s

    async def worker() -> None:
        while queue and time.perf_counter() < stop_at:
            n, source = queue.pop()
            t0 = time.perf_counter()
            await one(n, source)
            run.latencies.append(time.perf_counter() - t0)

    async with asyncio.timeout(CASE_DEADLINE_S):
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    run.wall = time.perf_counter() - started
    return run


# --- Serentak through the SDK ---


def serentak_upload(
    client: SerentakClient, path_mode: str, prefix: str
) -> Callable[[int, Source], Awaitable[None]]:
    """One file through the SDK as a new file `{prefix}-{n}.bin`; the completed upload
    must carry a version and the source's sha256."""

    async def one(n: int, source: Source) -> None:
        name = f"{prefix}-{n:04d}.bin"
        if path_mode == "auto":
            upload = await client.upload(source.path, name=name)
        else:
            created = await client.create_upload(source.path, name=name)
            await client.send_missing(created, source.path)
            upload = await client.wait_finished(created.upload_id)
        if upload.status != upload_pb2.UPLOAD_STATUS_COMPLETED or upload.file_version < 1:
            raise RuntimeError(f"{name}: upload ended {upload.status} v{upload.file_version}")
        if upload.final_checksum != source.sha256:
            raise RuntimeError(f"{name}: the committed checksum is not the source's")

    return one


# --- the peer: obstore PUT into s3s-fs (and the same, fsynced) ---


def fsync_object(path: Path) -> None:
    """fsync the object's file, then its folder (the rename that published it)."""
    for target, flags in ((path, os.O_RDONLY), (path.parent, os.O_RDONLY | os.O_DIRECTORY)):
        fd = os.open(target, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def peer_put(
    s3: S3Server, store: object, prefix: str, fsync_pool: ThreadPoolExecutor | None
) -> Callable[[int, Source], Awaitable[None]]:
    """One obstore PUT of the file to `{prefix}/{n}.bin`; with `fsync_pool`, the object's
    file and folder fsynced after the answer. The stored size is checked."""
    loop = asyncio.get_running_loop()

    async def one(n: int, source: Source) -> None:
        key = f"{prefix}/{n:04d}.bin"
        await obstore.put_async(store, key, source.path)  # type: ignore[arg-type]
        stored = s3.object_path(key)
        if fsync_pool is not None:
            await loop.run_in_executor(fsync_pool, fsync_object, stored)
        if stored.stat().st_size != source.size:
            raise RuntimeError(f"peer: {key} is not {source.size} bytes")

    return one


# --- the upload service's own account of each stage (its JSON log) ---


def stage_summary(lines: list[str], lock_lines: list[str]) -> str:
    """The upload service's timings from `lines` of its JSON log: rpc_completed per method
    (calls, p50/p99 ms), the merge job's pick-up lag and run time, merge (job start -> lock
    held), commit (lock held -> merge_completed), GetUpload calls per upload; and the lock
    service's rpc_completed per method from `lock_lines` (a Hold lasts from the acquire to
    the release: the lock wait and the commit under it)."""
    rpc: dict[str, list[float]] = defaultdict(list)
    for line in lock_lines:
        with contextlib.suppress(ValueError, KeyError):
            event = json.loads(line)
            if event.get("event") == "rpc_completed":
                rpc["locks " + event["method"].rsplit("/", 1)[-1]].append(event["duration_ms"])
    lag: list[float] = []
    job: list[float] = []
    started: dict[str, datetime] = {}
    locked: dict[str, datetime] = {}
    to_lock: list[float] = []
    commit: list[float] = []
    job_upload: dict[object, str] = {}
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        name = event.get("event")
        ts = datetime.fromisoformat(event["timestamp"]) if "timestamp" in event else None
        if name == "rpc_completed":
            rpc[event["method"].rsplit("/", 1)[-1]].append(float(event["duration_ms"]))
        elif name == "job_started" and event.get("job_type", "").startswith("upload.merge"):
            lag.append(float(event["lag_seconds"]) * 1000)
            key = event.get("idempotency_key") or event.get("job_id")
            if ts is not None:
                started[str(event.get("job_id"))] = ts
            job_upload[event.get("job_id")] = str(key)
        elif name == "job_finished" and event.get("job_type", "").startswith("upload.merge"):
            job.append(float(event["duration_seconds"]) * 1000)
        elif name == "merge_lock_acquired" and ts is not None:
            locked[event["upload_id"]] = ts
            begun = started.get(str(event.get("job_id")))
            if begun is not None:
                to_lock.append((ts - begun).total_seconds() * 1000)
        elif name == "merge_completed" and ts is not None:
            held = locked.get(event["upload_id"])
            if held is not None:
                commit.append((ts - held).total_seconds() * 1000)

    def fmt(values: list[float]) -> str:
        if not values:
            return "-"
        ordered = sorted(values)
        p99 = ordered[max(0, -(-len(ordered) * 99 // 100) - 1)]
        return f"{len(values)}x p50 {statistics.median(values):.1f} p99 {p99:.1f}"

    out = [f"    rpc {method}: {fmt(values)} ms" for method, values in sorted(rpc.items())]
    out.append(f"    merge job pick-up lag (enqueue -> job_started): {fmt(lag)} ms")
    out.append(f"    job_started -> merge_lock_acquired (merge + lock): {fmt(to_lock)} ms")
    out.append(f"    merge_lock_acquired -> merge_completed (commit): {fmt(commit)} ms")
    out.append(f"    merge job run (job_finished): {fmt(job)} ms")
    uploads = len(to_lock) or len(job)
    if uploads:
        out.append(f"    GetUpload calls per upload: {len(rpc.get('GetUpload', [])) / uploads:.2f}")
    return "\n".join(out)


class LogCursor:
    """Reads what a service logged since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size

    def new_lines(self) -> list[str]:
        """Lines written since the last call (or since this cursor was made)."""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        return data.decode(errors="replace").splitlines()


# --- profiling and syscall counting of another process (both bounded by the caller) ---


class Attached:
    """A tracer (py-spy or strace) attached to a process for the length of a `with`;
    SIGINT on exit makes it write its output."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.argv = argv
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Attached:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        time.sleep(0.5)  # attaching takes a moment; nothing to wait on but the clock
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def strace_counts(path: Path) -> Counter[str]:
    """Calls per syscall from `strace -c -o path` output."""
    counts: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split()
        # % time, seconds, usecs/call, calls, [errors], syscall
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
            counts[parts[-1]] += int(parts[3])
    return counts


async def durability_probe(stack: Stack, tmp: Path, sources: list[Source]) -> str | None:
    """The fsync-family calls per file made by s3s-fs (PUT), and by the upload service
    and etcd (Serentak upload, one at a time), counted with strace; None without strace."""
    if not shutil.which("strace"):
        return None
    out = []
    probes: list[tuple[str, list[int], Callable[[int, Source], Awaitable[None]]]] = [
        ("s3s-fs PUT", [stack.s3_pid], peer_put(stack.s3, stack.peer, "probe", None)),
        (
            "Serentak upload",
            [stack.upload.process.pid, stack.etcd_pid, stack.locks.process.pid],
            serentak_upload(stack.client, "auto", f"probe-{uuid.uuid4().hex[:6]}"),
        ),
    ]
    for label, pids, one in probes:
        files = [tmp / f"strace-{label[:3]}-{pid}.txt" for pid in pids]
        with ExitStack() as tracers:
            for pid, file in zip(pids, files, strict=True):
                argv = ["strace", "-f", "-c", "-e", f"trace={SYNC_CALLS}", "-o", str(file)]
                tracers.enter_context(Attached([*argv, "-p", str(pid)], tmp / "strace.log"))
            for n, source in enumerate(sources):
                await one(n, source)
        per_process = []
        for pid, file in zip(pids, files, strict=True):
            attached = f"Process {pid} attached" in (tmp / "strace.log").read_text(errors="replace")
            if not attached:
                # strace could not attach (no ptrace permission): say so, not "0 calls".
                per_process.append(f"{stack.names[pid]} not traced (see {tmp / 'strace.log'})")
                continue
            # strace -c writes nothing at all when it counted no call.
            counts = strace_counts(file) if file.exists() else Counter()
            total = sum(counts.values())
            detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
            per_process.append(f"{stack.names[pid]} {total / len(sources):.1f} ({detail})")
        out.append(f"  {label}, {len(sources)} files: per file " + "; ".join(per_process))
    return "\n".join(out)


# --- the stack ---


@dataclass
class Stack:
    """The running services, s3s-fs, the SDK client and the peer's store."""

    database: str
    upload: ServiceProcess
    locks: ServiceProcess
    etcd_pid: int
    s3: S3Server
    s3_pid: int
    client: SerentakClient
    peer: object
    names: dict[int, str]
    floor: Floor
    lean: Floor

    def serentak_pids(self) -> dict[str, int]:
        """The processes that serve a Serentak upload, by name."""
        return {name: pid for pid, name in self.names.items() if name != "s3s-fs"}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process (every thread) has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def timed_cpu(pids: dict[str, int], run: Awaitable[Run]) -> Run:
    """`run`, with the CPU time each process in `pids` spent meanwhile, and this one's."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    own = time.process_time()
    result = await run
    result.client_cpu = time.process_time() - own
    result.cpu = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
    return result


def postgres_database(stack: ExitStack, admin_dsn: str, what: str) -> str:
    """A fresh database on `admin_dsn`'s server, dropped when `stack` closes; its URL."""
    name = f"serentak_bench_small_{what}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    stack.callback(drop)
    url = make_url(admin_dsn).set(drivername="postgresql+psycopg", database=name)
    return url.render_as_string(hide_password=False)


async def start_stack(
    stack: ExitStack, tmp: Path, postgres: str | None, log_level: str, lean_plumbing: str = "none"
) -> Stack:
    """etcd, locks, notify and upload as `make run` starts them (PostgreSQL databases for
    upload and notify with `postgres`), s3s-fs, one SDK client and the peer's store."""
    etcd = EtcdServer(tmp / "etcd")
    etcd.start()
    stack.callback(etcd.stop)
    s3 = S3Server(tmp / "s3")
    s3.start()
    stack.callback(s3.stop)
    env = {
        "SERENTAK_LOG_LEVEL": log_level,
        "SERENTAK_ETCD_ENDPOINT": etcd.endpoint,
        # The services import the client distribution of this tree (its stubs).
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "client")]),
        # The benchmark is one user at full speed: no write limit (0: none).
        "SERENTAK_RATE_LIMIT_WRITES_PER_USER": "0",
        "SERENTAK_RATE_LIMIT_WRITES_PER_TENANT": "0",
    }
    database = "SQLite"
    floor_database = lean_database = None
    if postgres:
        env["SERENTAK_UPLOAD_DATABASE_URL"] = postgres_database(stack, postgres, "upload")
        env["SERENTAK_NOTIFY_DATABASE_URL"] = postgres_database(stack, postgres, "notify")
        floor_url = make_url(postgres_database(stack, postgres, "floor"))
        floor_database = floor_url.set(drivername="postgresql").render_as_string(False)
        lean_url = make_url(postgres_database(stack, postgres, "lean"))
        lean_database = lean_url.set(drivername="postgresql").render_as_string(False)
        database = "PostgreSQL"
    (tmp / "floor").mkdir()
    floor = Floor(tmp / "floor", floor_database)
    stack.callback(floor.stop)
    (tmp / "lean").mkdir()
    script, *options = LEAN_SCRIPTS[lean_plumbing]
    lean = Floor(tmp / "lean", lean_database, str(Path(__file__).with_name(script)), *options)
    stack.callback(lean.stop)
    for name in ("locks", "notify", "upload"):
        (tmp / name).mkdir()
    locks = stack.enter_context(service_process("locks", tmp / "locks", env))
    env["SERENTAK_LOCKS_ADDRESS"] = locks.address
    notify = stack.enter_context(service_process("notify", tmp / "notify", env))
    env["SERENTAK_NOTIFY_ADDRESS"] = notify.address
    upload = stack.enter_context(service_process("upload", tmp / "upload", env))
    client = SerentakClient(upload.address, token=TOKEN)
    # The peer: a plain obstore client of the same server (no prefix, path style).
    peer = S3Store(
        s3.bucket,
        endpoint=s3.endpoint,
        region=s3.region,
        access_key_id=s3.access_key,
        secret_access_key=s3.secret_key,
        virtual_hosted_style_request=False,
        client_options={"allow_http": True},
    )
    assert etcd.process is not None and s3.process is not None
    names = {
        upload.process.pid: "upload",
        locks.process.pid: "locks",
        notify.process.pid: "notify",
        etcd.process.pid: "etcd",
        s3.process.pid: "s3s-fs",
    }
    return Stack(
        database,
        upload,
        locks,
        etcd.process.pid,
        s3,
        s3.process.pid,
        client,
        peer,
        names,
        floor,
        lean,
    )


# --- the cases and the table ---


@dataclass
class Case:
    """One (database, size, concurrency) with each side's run."""

    database: str
    size: str
    concurrency: int
    runs: dict[str, Run]
    stages: str = ""


async def measure(
    stack: Stack,
    sources: dict[str, list[Source]],
    args: argparse.Namespace,
    tmp: Path,
) -> list[Case]:
    """Every (size, concurrency) on this stack: PUT, PUT+fsync, then Serentak."""
    cases = []
    upload_log = LogCursor(stack.upload.log_path)
    locks_log = LogCursor(stack.locks.log_path)
    for size in args.sizes:
        for concurrency in args.concurrency:
            files = sources[size][: args.files[concurrency]]
            tag = f"{size}-x{concurrency}-{uuid.uuid4().hex[:6]}"
            runs: dict[str, Run] = {}
            peer = {"s3s-fs": stack.s3_pid}
            runs[PUT] = await timed_cpu(
                peer,
                run_case(
                    files, concurrency, args.budget, peer_put(stack.s3, stack.peer, tag, None)
                ),
            )
            with ThreadPoolExecutor(concurrency, thread_name_prefix="fsync") as pool:
                runs[PUT_FSYNC] = await timed_cpu(
                    peer,
                    run_case(
                        files,
                        concurrency,
                        args.budget,
                        peer_put(stack.s3, stack.peer, f"{tag}-fsync", pool),
                    ),
                )
            upload_log.new_lines()
            locks_log.new_lines()
            with ExitStack() as profiling:
                if args.py_spy:
                    out = args.py_spy / f"{stack.database}-{size}-x{concurrency}.txt"
                    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
                    argv = [
                        pyspy,
                        "record",
                        "--nonblocking",
                        "-r",
                        "100",
                        "-f",
                        "raw",
                        "-o",
                        str(out),
                    ]
                    argv += ["-p", str(stack.upload.process.pid)]
                    argv += ["--gil"] if args.py_spy_gil else []
                    profiling.enter_context(Attached(argv, tmp / "py-spy.log"))
                runs[SERENTAK] = await timed_cpu(
                    stack.serentak_pids(),
                    run_case(
                        files,
                        concurrency,
                        args.budget,
                        serentak_upload(stack.client, args.path, tag),
                    ),
                )
            runs[FLOOR] = await timed_cpu(
                {"floor": stack.floor.process.pid},
                run_case(files, concurrency, args.budget, stack.floor.upload(tag)),
            )
            runs[LEAN] = await timed_cpu(
                {"lean floor": stack.lean.process.pid},
                run_case(files, concurrency, args.budget, stack.lean.upload(tag)),
            )
            case = Case(stack.database, size, concurrency, runs)
            if args.stages:
                case.stages = stage_summary(upload_log.new_lines(), locks_log.new_lines())
            cases.append(case)
            s, p = runs[SERENTAK], runs[PUT]
            cpu = ", ".join(f"{k} {v * 1000 / s.files:.1f}" for k, v in s.cpu.items())
            clients = ", ".join(
                f"{side} {r.client_cpu * 1000 / r.files:.1f}"
                for side, r in ((SERENTAK, s), (FLOOR, runs[FLOOR]), (LEAN, runs[LEAN]), (PUT, p))
                if r.files
            )
            print(
                f"  {stack.database} {size} x{concurrency}: Serentak {s.files} files "
                f"{s.rate:.1f}/s p50 {s.pct(50):.1f} ms; PUT {p.rate:.1f}/s "
                f"p50 {p.pct(50):.1f} ms; PUT+fsync {runs[PUT_FSYNC].rate:.1f}/s; "
                f"CPU ms/file: {cpu}; s3s-fs {p.cpu['s3s-fs'] * 1000 / p.files:.2f}; "
                f"client side (this process) {clients}",
                flush=True,
            )
            if case.stages:
                print(case.stages, flush=True)
    return cases


def verdicts(case: Case) -> tuple[str, str, str]:
    """The goals for this case's row: files/s >= 0.5x and p50 <= 3x the peer's (vs PUT /
    vs PUT+fsync) at 64 KiB x16; p50 <= 10 ms for one 64 KiB file alone."""
    s = case.runs[SERENTAK]
    key = (case.size, case.concurrency)
    rate = p50 = alone = ""
    if key == GOAL_CASE_THROUGHPUT:
        peers = (case.runs[PUT], case.runs[PUT_FSYNC])
        rate = "/".join(_yes(s.rate >= GOAL_RATIO * p.rate) for p in peers)
        p50 = "/".join(_yes(s.pct(50) <= GOAL_P50_RATIO * p.pct(50)) for p in peers)
    if key == GOAL_CASE_ALONE:
        alone = _yes(s.pct(50) <= GOAL_ALONE_MS)
    return rate, p50, alone


def cpu_per_file(run: Run) -> float:
    """The servers' CPU milliseconds per file of `run`."""
    return sum(run.cpu.values()) * 1000 / run.files if run.files else 0.0


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def print_table(cases: list[Case], path_mode: str) -> None:
    """One row per (database, size, concurrency): each side's files/s, p50, p99 (ms), the
    ratios against both peers, and the goals' verdicts."""
    print(
        f"\nsmall files: SDK upload (--path {path_mode}) end to end vs obstore PUT into "
        "s3s-fs (and PUT + fsync of the object file and folder), same files, same concurrency"
    )
    head = (
        f"{'db':<10} {'size':>4} {'at once':>7} {'files':>5} | "
        f"{'Serentak/s':>10} {'p50':>7} {'p99':>7} | {'PUT/s':>7} {'p50':>6} {'p99':>6} | "
        f"{'+fsync/s':>8} {'p50':>6} {'p99':>6} | {'files/s ratio':>13} {'p50 ratio':>11} | "
        f"{'>=0.5x f/s':>10} {'p50<=3x':>7} {'p50<=10ms':>9} | {'CPU ms/file':>11}"
    )
    print(head)
    print("-" * len(head))
    for case in cases:
        s, p, f = case.runs[SERENTAK], case.runs[PUT], case.runs[PUT_FSYNC]
        rate, p50, alone = verdicts(case)
        ratios = f"{s.rate / p.rate:.3f}/{s.rate / f.rate:.3f}"
        p50s = f"{s.pct(50) / p.pct(50):.0f}/{s.pct(50) / f.pct(50):.0f}"
        print(
            f"{case.database:<10} {case.size:>4} {case.concurrency:>7} {s.files:>5} | "
            f"{s.rate:>10.1f} {s.pct(50):>7.1f} {s.pct(99):>7.1f} | "
            f"{p.rate:>7.1f} {p.pct(50):>6.1f} {p.pct(99):>6.1f} | "
            f"{f.rate:>8.1f} {f.pct(50):>6.1f} {f.pct(99):>6.1f} | {ratios:>13} {p50s:>11} | "
            f"{rate:>10} {p50:>7} {alone:>9} | {cpu_per_file(s):>5.1f}/{cpu_per_file(p):<5.2f}"
        )
    print(
        "ms; files/s = files / the case's wall time; ratios Serentak/PUT and "
        "Serentak/(PUT+fsync); verdicts vs PUT / vs PUT+fsync. Goals: at 64k x16 files/s >= "
        f"{GOAL_RATIO}x and p50 <= {GOAL_P50_RATIO:.0f}x the peer's; 64k x1 p50 <= "
        f"{GOAL_ALONE_MS:.0f} ms. Every Serentak file committed with the source's sha256; "
        "every PUT's stored size checked. CPU ms/file: Serentak's processes (upload, locks, "
        "notify, etcd) / s3s-fs's, per file done (the clients' are on each case's progress"
        " line: the SDK's for Serentak and the floor, obstore's for the PUT)."
    )
    print_floor(cases)
    print_budget(cases)


def print_floor(cases: list[Case]) -> None:
    """The floors' rows per case: what a bare durable Python gRPC server (and a lean one doing
    Serentak's work) reaches in the same
    run, against the PUT (the most any Python service could show) and Serentak."""
    print(
        "\nthe floor (small_files_floor.py): a bare grpc.aio server that checks, writes and "
        "fsyncs each file and commits four rows for it (group commit); || the lean floor "
        "(small_files_lean.py): Serentak's checks and rows for a new file in one pass a group;"
        " same files, same concurrency, same run"
    )
    head = (
        f"{'db':<10} {'size':>4} {'at once':>7} | {'floor/s':>8} {'p50':>6} {'p99':>6} | "
        f"{'floor/PUT f/s':>13} {'floor/PUT p50':>13} | {'Serentak/floor f/s':>18} | "
        f"{'CPU ms/file':>11} || {'lean/s':>7} {'p50':>6} | {'lean/PUT f/s':>12} "
        f"{'lean/PUT p50':>12} | {'CPU ms/file':>11}"
    )
    print(head)
    print("-" * len(head))
    for case in cases:
        s, p, f = case.runs[SERENTAK], case.runs[PUT], case.runs[FLOOR]
        lean = case.runs[LEAN]
        print(
            f"{case.database:<10} {case.size:>4} {case.concurrency:>7} | "
            f"{f.rate:>8.1f} {f.pct(50):>6.1f} {f.pct(99):>6.1f} | "
            f"{f.rate / p.rate:>13.3f} {f.pct(50) / p.pct(50):>13.1f} | "
            f"{s.rate / f.rate:>18.3f} | {cpu_per_file(f):>11.1f} || "
            f"{lean.rate:>7.1f} {lean.pct(50):>6.1f} | {lean.rate / p.rate:>12.3f} "
            f"{lean.pct(50) / p.pct(50):>12.1f} | {cpu_per_file(lean):>11.1f}"
        )


def machine_ms(run: Run) -> float:
    """All of `run`'s CPU milliseconds per file on this machine: its servers' and its
    client side's (this process)."""
    return cpu_per_file(run) + (run.client_cpu * 1000 / run.files if run.files else 0.0)


def print_budget(cases: list[Case]) -> None:
    """For the throughput goal's case: the CPU a file the machine can give when files are
    done at the goal's rate (its cores, all busy, over 0.5x the PUT's files/s), against
    what each side spends a file, clients included. A side that spends more cannot reach
    the goal's rate on this machine, whatever its latency."""
    cores = os.cpu_count() or 1
    rows = [c for c in cases if (c.size, c.concurrency) == GOAL_CASE_THROUGHPUT]
    if not rows:
        return
    print(
        f"\nthe machine's budget at the goal ({cores} cores all busy / ({GOAL_RATIO}x the "
        "PUT's files/s)) vs the CPU a file each side spends, servers + client"
    )
    head = (
        f"{'db':<10} {'size':>4} {'at once':>7} | {'budget ms':>9} | {'PUT':>5} {'floor':>5} "
        f"{'lean':>5} {'Serentak':>8} | {'Serentak fits':>13} {'floor fits':>10} "
        f"{'lean fits':>9}"
    )
    print(head)
    print("-" * len(head))
    for case in rows:
        runs = case.runs
        budget = cores * 1000 / (GOAL_RATIO * runs[PUT].rate)
        s, f, lean = machine_ms(runs[SERENTAK]), machine_ms(runs[FLOOR]), machine_ms(runs[LEAN])
        print(
            f"{case.database:<10} {case.size:>4} {case.concurrency:>7} | {budget:>9.2f} | "
            f"{machine_ms(runs[PUT]):>5.2f} {f:>5.2f} {lean:>5.2f} {s:>8.2f} | "
            f"{_yes(s <= budget):>13} {_yes(f <= budget):>10} {_yes(lean <= budget):>9}"
        )


async def bench(args: argparse.Namespace, tmp: Path) -> None:
    """Make the files, then per database: start the stack, warm up, probe durability
    (first stack), run every case; print the table."""
    most = max(args.files[c] for c in args.concurrency)
    sources = {
        size: make_sources(tmp / "src", size, SIZES[size], most + WARMUP_FILES)
        for size in args.sizes
    }
    databases: list[str | None] = [] if args.postgres_only else [None]
    if args.postgres:
        databases.append(args.postgres)
    else:
        print("PostgreSQL: skipped (no --postgres DSN and no SERENTAK_TEST_PG_DSN)")
    cases: list[Case] = []
    probe: str | None = None
    for n, dsn in enumerate(databases):
        folder = tmp / f"stack{n}"
        folder.mkdir()
        with ExitStack() as stack:
            running = await start_stack(stack, folder, dsn, args.log_level, args.lean_plumbing)
            try:
                warm = [s for size in args.sizes for s in sources[size][-WARMUP_FILES:]]
                await run_case(warm, 1, 60.0, serentak_upload(running.client, args.path, "warm"))
                await run_case(warm, 1, 60.0, peer_put(running.s3, running.peer, "warm", None))
                if n == 0 and not args.no_probe:
                    probe = await durability_probe(running, folder, sources[args.sizes[0]][:8])
                print(f"{running.database}: stack up, warmed up", flush=True)
                cases += await measure(running, sources, args, folder)
            except Exception:
                print(running.upload.log_text()[-3000:], file=sys.stderr)
                raise
            finally:
                await running.client.close()
                await running.floor.channel.close()
                await running.lean.channel.close()
    print_table(cases, args.path)
    if probe:
        print(
            "durability probe (strace -f -c on the process while it served files one at a time; "
            f"{SYNC_CALLS}):\n{probe}"
        )
    elif not args.no_probe:
        print("durability probe: skipped (no strace)")


def main() -> None:
    """Parse arguments and run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="64 KiB only, x1 and x16, fewer files")
    parser.add_argument(
        "--path",
        choices=("auto", "chunks"),
        default="auto",
        help="auto: SerentakClient.upload (the SDK chooses); chunks: create_upload + "
        "send_missing + wait_finished",
    )
    parser.add_argument(
        "--postgres",
        metavar="DSN",
        default=os.environ.get("SERENTAK_TEST_PG_DSN"),
        help="also run on this PostgreSQL server (admin DSN; default SERENTAK_TEST_PG_DSN)",
    )
    parser.add_argument("--sqlite-only", action="store_true", help="skip PostgreSQL")
    parser.add_argument("--postgres-only", action="store_true", help="skip SQLite")
    parser.add_argument("--sizes", help="comma list of 4k, 64k, 1m")
    parser.add_argument("--concurrency", help="comma list of files in flight")
    parser.add_argument("--files", type=int, help="files per case (the most)")
    parser.add_argument("--budget", type=float, help="seconds after which a case starts no file")
    parser.add_argument("--stages", action="store_true", help="the server's timings per case")
    parser.add_argument("--py-spy", type=Path, metavar="DIR", help="py-spy the upload service")
    parser.add_argument(
        "--py-spy-gil", action="store_true", help="with --py-spy: only the thread holding the GIL"
    )
    parser.add_argument("--no-probe", action="store_true", help="skip the strace durability probe")
    parser.add_argument(
        "--log-level", default="INFO", help="the services' log level (INFO as `make run`)"
    )
    parser.add_argument(
        "--lean-plumbing",
        choices=tuple(LEAN_SCRIPTS),
        default="none",
        help="the lean floor's work on Serentak's group commit and sessions (sessions), and "
        "its RPC wrapper and logs (rpc): small_files_lean_infra.py; SQLite only",
    )
    args = parser.parse_args()
    if args.sqlite_only:
        args.postgres = None
    if args.lean_plumbing != "none" and (args.postgres or args.postgres_only):
        parser.error("--lean-plumbing runs on SQLite only: add --sqlite-only")
    if args.postgres_only and not args.postgres:
        parser.error("--postgres-only needs --postgres DSN or SERENTAK_TEST_PG_DSN")
    default_sizes = "64k" if args.quick else "4k,64k,1m"
    args.sizes = (args.sizes or default_sizes).split(",")
    if unknown := set(args.sizes) - set(SIZES):
        parser.error(f"unknown sizes {sorted(unknown)}; choose from {list(SIZES)}")
    default_concurrency = "1,16" if args.quick else "1,16,64"
    args.concurrency = [int(c) for c in (args.concurrency or default_concurrency).split(",")]
    counts = QUICK_FILES if args.quick else FILES
    args.files = {c: args.files or counts.get(c, max(counts[1], 3 * c)) for c in args.concurrency}
    if args.budget is None:
        args.budget = QUICK_BUDGET_S if args.quick else BUDGET_S
    if args.py_spy:
        args.py_spy.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench_small_files_") as tmp:
        asyncio.run(bench(args, Path(tmp)))


if __name__ == "__main__":
    main()
