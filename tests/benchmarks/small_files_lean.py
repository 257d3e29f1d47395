# ruff: noqa: E402 - the script puts the repository on sys.path before importing it
"""The lean floor for `bench_small_files.py`: what Serentak's UploadFile does for a new file,
written as lean as a Python grpc.aio service can write it. It answers "what would a rewrite
of the small-file path reach on this machine?".

    .venv/bin/python tests/benchmarks/small_files_lean.py PORT DIR [--postgres DSN]

Per file, as the floor (`small_files_floor.py`): the sha256 checked, the bytes written
(temp + fsync + rename + folder fsync, on a worker thread), one group commit shared with the
files arriving together. Added, as Serentak does them for a new file, in plain SQL on one
connection of its own (no ORM, no session). The group's statements run in one call on the
writer's thread: its reads in one pass, then its checks in Python, then its writes in one
pass (on PostgreSQL pipelined: a round trip for the reads, one for the change-log head, one
for the rest and the COMMIT).

- reads: each upload by its idempotency key (a retry answers the first upload), the target
  folder (live, a folder) and its chain of parents (the caller's rights), its shares (the
  audience), each name free in it (and not taken earlier in the group), the tenant's quota
  and use (with the group's bytes), the caller's open uploads (the cap);
- writes: each file row, outbox event, change row per audience member, audit row and
  completed upload row; once a group, the folder's children version, the tenant's use and
  the change-log head (the group's sequence numbers);
- the relay's part here: the previous group's events marked published in the next group's
  transaction (on SQLite Serentak's relay rides the group commits too). Its gRPC call to
  notify is not made: notify's own CPU (~1 ms a file, on the other core) is Serentak's
  alone in the benchmark's tables;
- one JSON log line and two metrics (a counter, a latency histogram) a request.

Left out: the file lock and fencing (a new file takes none in Serentak either),
authentication (the benchmark's token is `make run`'s development one), tracing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import sqlite3
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "client"), str(REPO / "tests")]

import grpc
import psycopg
from benchmarks.small_files_floor import GroupWriter, _write, floor_arguments, serve_upload_file
from prometheus_client import Counter, Histogram
from serentak.upload.v1 import upload_pb2

TENANT, USER, FOLDER, QUOTA = "acme", "alice", "root-folder", 1 << 40

_TABLES = (
    "CREATE TABLE files (id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, parent_id TEXT,"
    " name TEXT NOT NULL, kind TEXT NOT NULL, owner_user_id TEXT NOT NULL, version BIGINT"
    " NOT NULL, children_version BIGINT NOT NULL, size BIGINT NOT NULL, checksum TEXT,"
    " content_key TEXT, created_at TEXT NOT NULL, updated_at TEXT NOT NULL, deleted_at TEXT)",
    "CREATE UNIQUE INDEX files_live_name ON files (tenant_id, parent_id, name)"
    " WHERE deleted_at IS NULL",
    "CREATE TABLE shares (file_id TEXT NOT NULL, user_id TEXT NOT NULL,"
    " PRIMARY KEY (file_id, user_id))",
    "CREATE TABLE tenant_usage (tenant_id TEXT PRIMARY KEY, used_bytes BIGINT NOT NULL,"
    " quota_bytes BIGINT NOT NULL)",
    "CREATE TABLE uploads (id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, owner_user_id TEXT"
    " NOT NULL, request_key TEXT NOT NULL UNIQUE, file_id TEXT NOT NULL, name TEXT NOT NULL,"
    " status TEXT NOT NULL, total_size BIGINT NOT NULL, final_checksum TEXT NOT NULL,"
    " file_version BIGINT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL)",
    "CREATE INDEX uploads_open ON uploads (tenant_id, owner_user_id, status)",
    "CREATE TABLE outbox_events (event_id TEXT PRIMARY KEY, aggregate_id TEXT NOT NULL,"
    " version BIGINT NOT NULL, event_type TEXT NOT NULL, event BYTEA NOT NULL,"
    " created_at TEXT NOT NULL, published_at TEXT)",
    "CREATE TABLE change_heads (tenant_id TEXT PRIMARY KEY, last_seq BIGINT NOT NULL)",
    "CREATE TABLE file_changes (tenant_id TEXT NOT NULL, user_id TEXT NOT NULL, seq BIGINT"
    " NOT NULL, file_id TEXT NOT NULL, event_type TEXT NOT NULL, version BIGINT NOT NULL,"
    " created_at TEXT NOT NULL, PRIMARY KEY (tenant_id, user_id, seq))",
    "CREATE TABLE audit_events (id TEXT PRIMARY KEY, at TEXT NOT NULL, tenant_id TEXT NOT"
    " NULL, principal TEXT NOT NULL, action TEXT NOT NULL, target_id TEXT NOT NULL,"
    " detail TEXT NOT NULL)",
)
_SEED = (
    (
        "INSERT INTO files VALUES (?, ?, NULL, ?, 'folder', ?, 1, 0, 0, NULL, NULL, ?, ?, NULL)",
        (FOLDER, TENANT, "root", USER, "2026-01-01", "2026-01-01"),
    ),
    ("INSERT INTO tenant_usage VALUES (?, 0, ?)", (TENANT, QUOTA)),
)
_READS = {
    "upload": "SELECT id, file_id, file_version, final_checksum FROM uploads WHERE request_key = ?",
    "folder": "SELECT kind, owner_user_id, deleted_at FROM files WHERE id = ?",
    "shares": "SELECT user_id FROM shares WHERE file_id = ?",
    "name": "SELECT id FROM files WHERE tenant_id = ? AND parent_id = ? AND name = ?"
    " AND deleted_at IS NULL",
    "quota": "SELECT used_bytes, quota_bytes FROM tenant_usage WHERE tenant_id = ?",
    "chain": "WITH RECURSIVE chain(id, parent_id, owner_user_id, depth) AS (SELECT id,"
    " parent_id, owner_user_id, 0 FROM files WHERE id = ? UNION ALL SELECT f.id, f.parent_id,"
    " f.owner_user_id, c.depth + 1 FROM files f JOIN chain c ON f.id = c.parent_id WHERE"
    " c.depth < 64) SELECT owner_user_id FROM chain",
    "open": "SELECT count(*) FROM uploads WHERE tenant_id = ? AND owner_user_id = ?"
    " AND status IN ('uploading', 'merging')",
}
_WRITES = {
    "file": "INSERT INTO files VALUES (?, ?, ?, ?, 'file', ?, 1, 0, ?, ?, ?, ?, ?, NULL)",
    "folder": "UPDATE files SET children_version = children_version + ? WHERE id = ?",
    "usage": "UPDATE tenant_usage SET used_bytes = used_bytes + ? WHERE tenant_id = ?",
    "event": "INSERT INTO outbox_events VALUES (?, ?, 1, 'file.content.updated', ?, ?, NULL)",
    "head": "INSERT INTO change_heads VALUES (?, ?) ON CONFLICT (tenant_id) DO UPDATE SET"
    " last_seq = change_heads.last_seq + ? RETURNING last_seq",
    "change": "INSERT INTO file_changes VALUES (?, ?, ?, ?, 'file.content.updated', 1, ?)",
    "audit": "INSERT INTO audit_events VALUES (?, ?, ?, ?, 'file.content.updated', ?, ?)",
    "upload": "INSERT INTO uploads VALUES (?, ?, ?, ?, ?, ?, 'completed', ?, ?, 1, ?, ?)",
}
_PUBLISHED = "UPDATE outbox_events SET published_at = ? WHERE event_id = ?"

FILES = Counter("lean_files", "files committed")
SECONDS = Histogram("lean_upload_seconds", "UploadFile's time")


@dataclass
class NewFile:
    """One UploadFile's new file, as the group commit writes it; `answer` is filled in."""

    request_key: str
    name: str
    size: int
    digest: str
    upload_id: str
    file_id: str
    event_id: str
    answer: tuple[str, str, int, str] | None = None
    refused: str = ""


class LeanCommits:
    """The group's checks and writes in one call on the writer's thread, on one connection
    (`execute(sql, values) -> rows`, `begin()`, `commit()`, `rollback()`)."""

    def __init__(self, db: Any, placeholder: str, begin: str) -> None:
        self._db = db
        self._begin = begin
        self._reads = {k: v.replace("?", placeholder) for k, v in _READS.items()}
        self._writes = {k: v.replace("?", placeholder) for k, v in _WRITES.items()}
        self._published = _PUBLISHED.replace("?", placeholder)
        self._unpublished: list[str] = []
        for table in _TABLES:
            db.execute(table if placeholder == "%s" else table.replace("BYTEA", "BLOB"))
        for sql, values in _SEED:
            db.execute(sql.replace("?", placeholder), values)

    def __call__(self, groups: list[list[NewFile]]) -> None:
        files = [f for group in groups for f in group]
        postgres = isinstance(self._db, psycopg.Connection)
        with self._db.pipeline() if postgres else contextlib.nullcontext() as pipeline:
            self._db.execute(self._begin)
            try:
                self._commit(files, pipeline.sync if pipeline else lambda: None)
                self._db.execute("COMMIT")
            except BaseException:
                self._unpublished = []
                if not postgres:
                    self._db.execute("ROLLBACK")
                raise
        if postgres and self._db.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            self._db.execute("ROLLBACK")

    def _commit(self, files: list[NewFile], sync: Callable[[], None]) -> None:
        """The group's reads in one pass (one round trip on PostgreSQL), its checks, then its
        writes in one pass (one more, and one for the change-log head)."""
        now = datetime.now(UTC).isoformat()
        db, reads, writes = self._db, self._reads, self._writes
        for event_id in self._unpublished:
            db.execute(self._published, (now, event_id))
        self._unpublished = []
        shared = {
            "folder": db.execute(reads["folder"], (FOLDER,)),
            "chain": db.execute(reads["chain"], (FOLDER,)),
            "shares": db.execute(reads["shares"], (FOLDER,)),
            "quota": db.execute(reads["quota"], (TENANT,)),
            "open": db.execute(reads["open"], (TENANT, USER)),
        }
        own = [
            (
                db.execute(reads["upload"], (f.request_key,)),
                db.execute(reads["name"], (TENANT, FOLDER, f.name)),
            )
            for f in files
        ]
        sync()
        folder = shared["folder"].fetchone()
        chain = shared["chain"].fetchall()
        audience = [USER] + [r[0] for r in shared["shares"].fetchall()]
        used, quota = shared["quota"].fetchone()
        (open_uploads,) = shared["open"].fetchone()
        names: set[str] = set()
        new: list[NewFile] = []
        for f, (done, taken) in zip(files, own, strict=True):
            first = next(iter(done.fetchall()), None)
            if first is not None:
                f.answer = tuple(first)  # a retry: the first upload's outcome
            elif folder is None or folder[0] != "folder" or folder[2] is not None:
                f.refused = "FOLDER_NOT_FOUND"
            elif not any(owner == USER for (owner,) in chain):
                f.refused = "PERMISSION_DENIED"
            elif f.name in names or taken.fetchall():
                f.refused = "NAME_TAKEN"
            elif used + f.size > quota:
                f.refused = "QUOTA_EXCEEDED"
            elif open_uploads >= 1000:
                f.refused = "TOO_MANY_UPLOADS"
            else:
                names.add(f.name)
                used += f.size
                new.append(f)
        if not new:
            return
        (last,) = db.execute(writes["head"], (TENANT, len(new), len(new))).fetchone()
        for seq, f in enumerate(new, start=last - len(new) + 1):
            event = upload_pb2.Upload(
                upload_id=f.upload_id, file_id=f.file_id, file_version=1, final_checksum=f.digest
            ).SerializeToString()
            db.execute(
                writes["file"],
                (f.file_id, TENANT, FOLDER, f.name, USER, f.size, f.digest, f.upload_id, now, now),
            )
            db.execute(writes["event"], (f.event_id, f.file_id, event, now))
            for user in audience:
                db.execute(writes["change"], (TENANT, user, seq, f.file_id, now))
            detail = json.dumps({"upload_id": f.upload_id, "size": f.size})
            db.execute(writes["audit"], (uuid.uuid4().hex, now, TENANT, USER, f.file_id, detail))
            db.execute(
                writes["upload"],
                (
                    f.upload_id,
                    TENANT,
                    USER,
                    f.request_key,
                    f.file_id,
                    f.name,
                    f.size,
                    f.digest,
                    now,
                    now,
                ),
            )
            f.answer = (f.upload_id, f.file_id, 1, f.digest)
            self._unpublished.append(f.event_id)
        db.execute(writes["folder"], (len(new), FOLDER))
        db.execute(writes["usage"], (sum(f.size for f in new), TENANT))


def sqlite_commits(path: Path) -> LeanCommits:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return LeanCommits(db, "?", "BEGIN IMMEDIATE")


def postgres_commits(dsn: str) -> LeanCommits:
    db = psycopg.connect(dsn, autocommit=True)
    return LeanCommits(db, "%s", "BEGIN")


async def serve(port: int, folder: Path, postgres: str | None) -> None:
    blobs = folder / "blobs"
    blobs.mkdir(parents=True)
    commits = postgres_commits(postgres) if postgres else sqlite_commits(folder / "lean.db")
    writer = GroupWriter(commits)  # type: ignore[arg-type]
    log = (folder / "lean.log").open("a", buffering=1 << 16)

    async def upload_file(
        request: upload_pb2.UploadFileRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.UploadFileResponse:
        started = time.perf_counter()
        data = request.data
        digest = hashlib.sha256(data).hexdigest()
        if request.checksum and request.checksum != digest:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "CHECKSUM_MISMATCH")
        name = request.new_file.name
        if not name or "/" in name or len(name) > 255:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_NAME")
        key = f"{TENANT}:{USER}:{request.client_request_id or uuid.uuid4().hex}"
        f = NewFile(
            key, name, len(data), digest, uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
        )
        await asyncio.to_thread(_write, blobs, f.upload_id, data)
        await writer.write([f])  # type: ignore[list-item]
        if f.answer is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f.refused)
        answer = upload_pb2.UploadFileResponse()
        up = answer.upload
        up.upload_id, up.file_id, up.file_version, up.final_checksum = f.answer  # type: ignore[misc]
        up.status = upload_pb2.UPLOAD_STATUS_COMPLETED
        elapsed = time.perf_counter() - started
        FILES.inc()
        SECONDS.observe(elapsed)
        log.write(
            json.dumps(
                {
                    "event": "upload_file",
                    "level": "info",
                    "tenant": TENANT,
                    "user": USER,
                    "upload_id": f.upload_id,
                    "file_id": f.file_id,
                    "size": f.size,
                    "ms": round(elapsed * 1000, 2),
                    "at": datetime.now(UTC).isoformat(),
                }
            )
            + "\n"
        )
        return answer

    await serve_upload_file(port, upload_file, beside=writer.run())


def main() -> None:
    parser = floor_arguments(__doc__)
    parser.add_argument("--postgres", metavar="DSN", help="a database of its own to write to")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.folder, args.postgres))


if __name__ == "__main__":
    main()
