# ruff: noqa: E402 - the script puts the repository on sys.path before importing it
"""The floor for `bench_small_files.py`: the least any durable small-file server written as
a Python grpc.aio service must do per file, with nothing of Serentak's own.

    .venv/bin/python tests/benchmarks/small_files_floor.py PORT DIR [--postgres DSN]

`UploadFile` (Serentak's request and answer messages, on a service of its own) checks the
data's sha256, writes it to a file of its own (temp + fsync + rename + folder fsync: one
call on a worker thread, as Serentak's local store) and records it in one database
transaction: the upload row, the file row, the outbox event and the audit row (four
single-row INSERTs), committed durably (SQLite WAL with synchronous FULL, or PostgreSQL).
Requests that arrive together share one transaction (group commit, on one connection of
its own); each answer comes after its COMMIT. It is as fast as this design can be.

Left out, as no floor has them: authentication, permissions, name and quota checks, the
file lock and fencing, versions and the change log, idempotency by client_request_id, the
notification fan-out (another process), logs and metrics. What it measures is what gRPC,
Python, the two fsyncs and a durable commit cost on this machine for one small file.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "client"), str(REPO / "tests")]

import grpc
import psycopg
from serentak.upload.v1 import upload_pb2

SERVICE = "serentak.bench.v1.SmallFilesFloor"
METHOD = f"/{SERVICE}/UploadFile"
_TABLES = (
    "CREATE TABLE uploads (id TEXT PRIMARY KEY, name TEXT NOT NULL, size BIGINT NOT NULL,"
    " checksum TEXT NOT NULL)",
    "CREATE TABLE files (id TEXT PRIMARY KEY, name TEXT NOT NULL, version BIGINT NOT NULL,"
    " blob_key TEXT NOT NULL)",
    "CREATE TABLE events (event_id TEXT PRIMARY KEY, aggregate_id TEXT NOT NULL,"
    " event BYTEA NOT NULL)",
    "CREATE TABLE audit (id TEXT PRIMARY KEY, action TEXT NOT NULL, target_id TEXT NOT NULL)",
)
_ROWS = (
    "INSERT INTO uploads VALUES ({0}, {0}, {0}, {0})",
    "INSERT INTO files VALUES ({0}, {0}, 1, {0})",
    "INSERT INTO events VALUES ({0}, {0}, {0})",
    "INSERT INTO audit VALUES ({0}, 'file.content.updated', {0})",
)


def _write(folder: Path, key: str, data: bytes) -> None:
    """Temp + fsync + rename + folder fsync (Serentak's local store does the same)."""
    staged = folder / f".{key}.tmp"
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(staged, folder / key)
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class GroupWriter:
    """Commits the rows of every request waiting at the time in one transaction."""

    def __init__(self, commit: Callable[[list[list[tuple[Any, ...]]]], None]) -> None:
        self._commit = commit
        self._queue: list[tuple[list[tuple[Any, ...]], asyncio.Future[None]]] = []
        self._wake = asyncio.Event()

    async def write(self, rows: list[tuple[Any, ...]]) -> None:
        future = asyncio.get_running_loop().create_future()
        self._queue.append((rows, future))
        self._wake.set()
        await future

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                group, self._queue = self._queue, []
                try:
                    await asyncio.to_thread(self._commit, [rows for rows, _ in group])
                except Exception as exc:
                    for _, future in group:
                        future.set_exception(exc)
                    continue
                for _, future in group:
                    future.set_result(None)


def sqlite_commit(path: Path) -> Callable[[list[list[tuple[Any, ...]]]], None]:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    for table in _TABLES:
        db.execute(table.replace("BYTEA", "BLOB"))
    statements = [sql.format("?") for sql in _ROWS]

    def commit(groups: list[list[tuple[Any, ...]]]) -> None:
        db.execute("BEGIN IMMEDIATE")
        for rows in groups:
            for sql, values in zip(statements, rows, strict=True):
                db.execute(sql, values)
        db.execute("COMMIT")

    return commit


def postgres_commit(dsn: str) -> Callable[[list[list[tuple[Any, ...]]]], None]:
    db = psycopg.connect(dsn, autocommit=True)
    for table in _TABLES:
        db.execute(table)
    statements = [sql.format("%s") for sql in _ROWS]

    def commit(groups: list[list[tuple[Any, ...]]]) -> None:
        with db.transaction(), db.pipeline():
            for rows in groups:
                for sql, values in zip(statements, rows, strict=True):
                    db.execute(sql, values)

    return commit


async def serve(port: int, folder: Path, postgres: str | None) -> None:
    blobs = folder / "blobs"
    blobs.mkdir(parents=True)
    commit = postgres_commit(postgres) if postgres else sqlite_commit(folder / "floor.db")
    writer = GroupWriter(commit)

    async def upload_file(
        request: upload_pb2.UploadFileRequest, _ctx: grpc.aio.ServicerContext
    ) -> upload_pb2.UploadFileResponse:
        data = request.data
        digest = hashlib.sha256(data).hexdigest()
        if request.checksum and request.checksum != digest:
            raise ValueError("checksum mismatch")
        upload_id, file_id = uuid.uuid4().hex, uuid.uuid4().hex
        await asyncio.to_thread(_write, blobs, upload_id, data)
        name = request.new_file.name
        await writer.write(
            [
                (upload_id, name, len(data), digest),
                (file_id, name, upload_id),
                (uuid.uuid4().hex, file_id, digest.encode()),
                (uuid.uuid4().hex, file_id),
            ]
        )
        answer = upload_pb2.UploadFileResponse()
        answer.upload.upload_id, answer.upload.file_id = upload_id, file_id
        answer.upload.status = upload_pb2.UPLOAD_STATUS_COMPLETED
        answer.upload.file_version, answer.upload.final_checksum = 1, digest
        return answer

    await serve_upload_file(port, upload_file, beside=writer.run())


UploadFile = Callable[
    [upload_pb2.UploadFileRequest, grpc.aio.ServicerContext],
    Awaitable[upload_pb2.UploadFileResponse],
]


async def serve_upload_file(
    port: int,
    upload_file: UploadFile,
    *,
    beside: Coroutine[Any, Any, None] | None = None,
    wrap: Callable[[grpc.RpcMethodHandler], grpc.RpcMethodHandler] = lambda handler: handler,
) -> None:
    """Serve `upload_file` as this service's UploadFile (its handler `wrap`ped) on
    127.0.0.1:`port`, `beside` running meanwhile (a group writer), until terminated; print
    "ready" once it answers (what `Floor` waits for). The floors' servers all start here."""
    handler = wrap(
        grpc.unary_unary_rpc_method_handler(
            upload_file,
            request_deserializer=upload_pb2.UploadFileRequest.FromString,
            response_serializer=upload_pb2.UploadFileResponse.SerializeToString,
        )
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(SERVICE, {"UploadFile": handler})]
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    running = asyncio.create_task(beside) if beside is not None else None
    print("ready", flush=True)
    try:
        await server.wait_for_termination()
    finally:
        if running is not None:
            running.cancel()


def floor_arguments(doc: str | None) -> argparse.ArgumentParser:
    """A floor script's arguments: PORT and DIR (its data), as `Floor` passes them."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("port", type=int)
    parser.add_argument("folder", type=Path)
    return parser


def main() -> None:
    parser = floor_arguments(__doc__)
    parser.add_argument("--postgres", metavar="DSN", help="a database of its own to write to")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.folder, args.postgres))


if __name__ == "__main__":
    main()


# --- the client side (in bench_small_files.py's process) ---


class Floor:
    """A running floor server (this script's, or `script`'s with `options`: the lean
    floor) and a channel to it."""

    def __init__(
        self, folder: Path, postgres: str | None, script: str = __file__, *options: str
    ) -> None:
        from support.ports import free_port

        self.port = free_port()
        argv = [sys.executable, script, str(self.port), str(folder), *options]
        argv += ["--postgres", postgres] if postgres else []
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "ready":
            self.process.kill()
            raise RuntimeError("the floor server did not start")
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        self._call = self.channel.unary_unary(
            METHOD,
            request_serializer=upload_pb2.UploadFileRequest.SerializeToString,
            response_deserializer=upload_pb2.UploadFileResponse.FromString,
        )

    def upload(self, prefix: str) -> Callable[[int, Any], Awaitable[None]]:
        """One file as the SDK sends it (read, sha256, one UploadFile); the answer must
        carry the source's sha256."""

        async def one(n: int, source: Any) -> None:
            data = await asyncio.to_thread(source.path.read_bytes)
            request = upload_pb2.UploadFileRequest(
                data=data, checksum=hashlib.sha256(data).hexdigest()
            )
            request.new_file.name = f"{prefix}-{n:04d}.bin"
            answer = await self._call(request)
            if answer.upload.final_checksum != source.sha256:
                raise RuntimeError(f"floor: {request.new_file.name} answered another checksum")

        return one

    def stop(self) -> None:
        """Stop the server (the channel is closed by its user, on its event loop)."""
        self.process.terminate()
        self.process.wait(10)
