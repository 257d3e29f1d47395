# ruff: noqa: E402 - the script puts the repository on sys.path before importing it
"""The lean floor's work on Serentak's own plumbing: which part of Serentak's cost a small
file is the plumbing and which is the small-file path's own code.

    .venv/bin/python tests/benchmarks/small_files_lean_infra.py PORT DIR [--rpc]

The same reads, checks and writes as `small_files_lean.py` (SQLite only), but each file is
a unit of Serentak's group committer (`services.common.group_commit`), run in an
AsyncSession on Serentak's engine (`services.common.db`), its statements
`SessionStatement`s, its rows written behind (`services.common.write_behind`): the upload
service's way of running a small file's commit, with none of its domain code. `--rpc`
also serves it through Serentak's RPC wrapper (`rpc_wrapper.wrap_handler`: correlation
id, accounting, the `rpc_completed` line) with Serentak's JSON logs, the handler logging
`upload_file_committed` as the upload service does. `bench_small_files.py
--lean-plumbing sessions|rpc` runs it in place of the lean floor.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import sys
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "client"), str(REPO / "tests")]

import grpc
from benchmarks.small_files_floor import SERVICE, _write, floor_arguments, serve_upload_file
from benchmarks.small_files_lean import _READS, _SEED, _TABLES, FILES, FOLDER, TENANT, USER
from serentak.upload.v1 import upload_pb2
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from services.common import write_behind
from services.common.db import create_engine, session_factory
from services.common.group_commit import GroupCommits
from services.common.logging import configure_logging, get_logger
from services.common.rpc_wrapper import wrap_handler
from services.common.session_sql import SessionStatement


def _statement(sql: str, *names: str) -> SessionStatement:
    """`sql` with its `?` placeholders named `names`, in order."""
    parts = sql.split("?")
    if len(parts) != len(names) + 1:
        raise ValueError(f"{len(parts) - 1} placeholders, {len(names)} names: {sql}")
    named = parts[0] + "".join(f":{n}{rest}" for n, rest in zip(names, parts[1:], strict=True))
    return SessionStatement(text(named))


_UPLOAD = _statement(_READS["upload"], "key")
_FOLDER = _statement(_READS["folder"], "id")
_CHAIN = _statement(_READS["chain"], "id")
_SHARES = _statement(_READS["shares"], "id")
_NAME = _statement(_READS["name"], "tenant", "parent", "name")
_QUOTA = _statement(_READS["quota"], "tenant")
_OPEN = _statement(_READS["open"], "tenant", "user")
_FILE_ROWS = write_behind.Rows(
    SessionStatement(
        text(
            "INSERT INTO files VALUES (:id, :tenant, :parent, :name, 'file', :owner, 1, 0,"
            " :size, :digest, :key, :now, :now, NULL)"
        )
    )
)
_EVENTS = write_behind.Rows(
    SessionStatement(
        text(
            "INSERT INTO outbox_events VALUES (:id, :file, 1, 'file.content.updated', :event,"
            " :now, NULL)"
        )
    )
)
_AUDIT = write_behind.Rows(
    SessionStatement(
        text(
            "INSERT INTO audit_events VALUES (:id, :now, :tenant, :user,"
            " 'file.content.updated', :file, :detail)"
        )
    )
)
_UPLOADS = write_behind.Rows(
    SessionStatement(
        text(
            "INSERT INTO uploads VALUES (:id, :tenant, :user, :key, :file, :name, 'completed',"
            " :size, :digest, 1, :now, :now)"
        )
    )
)
_HEAD = SessionStatement(
    text(
        "INSERT INTO change_heads VALUES (:tenant, :n) ON CONFLICT (tenant_id) DO UPDATE SET"
        " last_seq = change_heads.last_seq + :n RETURNING last_seq"
    )
)
_CHANGE = SessionStatement(
    text(
        "INSERT INTO file_changes VALUES (:tenant, :user, :seq, :file, 'file.content.updated',"
        " 1, :now)"
    )
)
_BUMP = SessionStatement(
    text("UPDATE files SET children_version = children_version + :n WHERE id = :id")
)
_USAGE = SessionStatement(
    text("UPDATE tenant_usage SET used_bytes = used_bytes + :n WHERE tenant_id = :tenant")
)
_PUBLISHED = SessionStatement(
    text("UPDATE outbox_events SET published_at = :now WHERE event_id = :id")
)


class _Changes:
    """The group's change rows: its sequence numbers from one upsert of the head."""

    async def write(self, session: AsyncSession, items: list[tuple[str, list[str], str]]) -> None:
        (last,) = await _HEAD.one(session, {"tenant": TENANT, "n": len(items)})
        rows = [
            {"tenant": TENANT, "user": user, "seq": seq, "file": file_id, "now": now}
            for seq, (file_id, audience, now) in enumerate(items, start=last - len(items) + 1)
            for user in audience
        ]
        await _CHANGE.execute_many(session, rows)


class _Totals:
    """Once a group: the folder's children version, the tenant's use, and the previous
    group's events marked published (the relay's database part)."""

    def __init__(self) -> None:
        self.unpublished: list[str] = []

    async def write(self, session: AsyncSession, sizes: list[int]) -> None:
        await _BUMP.execute(session, {"n": len(sizes), "id": FOLDER})
        await _USAGE.execute(session, {"n": sum(sizes), "tenant": TENANT})
        now = datetime.now(UTC).isoformat()
        await _PUBLISHED.execute_many(session, [{"now": now, "id": e} for e in self.unpublished])
        self.unpublished = []


_CHANGES, _TOTALS = _Changes(), _Totals()


class Refused(Exception):
    """A file its checks refuse: FAILED_PRECONDITION with this reason."""


def commit_unit(f: Mapping[str, Any]) -> Callable[[AsyncSession], Awaitable[Sequence[Any]]]:
    """The unit of work that checks and writes the new file `f` (small_files_lean's reads,
    checks and rows, one file at a time)."""

    async def unit(session: AsyncSession) -> Sequence[Any]:
        now = datetime.now(UTC).isoformat()
        done = await _UPLOAD.first(session, {"key": f["key"]})
        if done is not None:
            return tuple(done)  # a retry: the first upload's outcome
        folder = await _FOLDER.first(session, {"id": FOLDER})
        if folder is None or folder[0] != "folder" or folder[2] is not None:
            raise Refused("FOLDER_NOT_FOUND")
        if not any(owner == USER for (owner,) in await _CHAIN.rows(session, {"id": FOLDER})):
            raise Refused("PERMISSION_DENIED")
        audience = [USER, *(r[0] for r in await _SHARES.rows(session, {"id": FOLDER}))]
        taken = await _NAME.first(session, {"tenant": TENANT, "parent": FOLDER, "name": f["name"]})
        if taken or any(r["name"] == f["name"] for r in write_behind.pending(session, _FILE_ROWS)):
            raise Refused("NAME_TAKEN")
        used, quota = await _QUOTA.one(session, {"tenant": TENANT})
        if used + sum(write_behind.pending(session, _TOTALS)) + f["size"] > quota:
            raise Refused("QUOTA_EXCEEDED")
        (open_uploads,) = await _OPEN.one(session, {"tenant": TENANT, "user": USER})
        if open_uploads >= 1000:
            raise Refused("TOO_MANY_UPLOADS")
        event = upload_pb2.Upload(
            upload_id=f["upload_id"],
            file_id=f["file_id"],
            file_version=1,
            final_checksum=f["digest"],
        ).SerializeToString()
        same = {"tenant": TENANT, "now": now, "size": f["size"], "digest": f["digest"]}
        row = {**same, "id": f["file_id"], "parent": FOLDER, "name": f["name"], "owner": USER}
        await write_behind.write(session, _FILE_ROWS, {**row, "key": f["upload_id"]})
        await write_behind.write(
            session,
            _EVENTS,
            {"id": f["event_id"], "file": f["file_id"], "event": event, "now": now},
        )
        await write_behind.write(session, _CHANGES, (f["file_id"], audience, now))
        detail = json.dumps({"upload_id": f["upload_id"], "size": f["size"]})
        await write_behind.write(
            session,
            _AUDIT,
            {"id": uuid.uuid4().hex, "now": now, "tenant": TENANT, "user": USER,
             "file": f["file_id"], "detail": detail},
        )  # fmt: skip
        await write_behind.write(
            session,
            _UPLOADS,
            {**same, "id": f["upload_id"], "user": USER, "key": f["key"], "file": f["file_id"],
             "name": f["name"]},
        )  # fmt: skip
        await write_behind.write(session, _TOTALS, f["size"])
        return (f["upload_id"], f["file_id"], 1, f["digest"])

    return unit


async def serve(port: int, folder: Path, rpc: bool) -> None:
    blobs = folder / "blobs"
    blobs.mkdir(parents=True)
    path = folder / "lean.db"
    with sqlite3.connect(path, isolation_level=None) as db:
        db.execute("PRAGMA journal_mode=WAL")
        for table in _TABLES:
            db.execute(table.replace("BYTEA", "BLOB"))
        for sql, values in _SEED:
            db.execute(sql, values)
    groups = GroupCommits(session_factory(create_engine(f"sqlite:///{path}")))
    if rpc:
        sys.stderr = (folder / "lean.log").open("a", buffering=1 << 16)
        configure_logging("lean", once=True)
    log = get_logger("lean")

    async def upload_file(
        request: upload_pb2.UploadFileRequest, context: grpc.aio.ServicerContext
    ) -> upload_pb2.UploadFileResponse:
        data = request.data
        digest = hashlib.sha256(data).hexdigest()
        if request.checksum and request.checksum != digest:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "CHECKSUM_MISMATCH")
        crid = request.client_request_id or uuid.uuid4().hex
        f = {
            "key": f"{TENANT}:{USER}:{crid}",
            "name": request.new_file.name,
            "size": len(data),
            "digest": digest,
            "upload_id": uuid.uuid4().hex,
            "file_id": uuid.uuid4().hex,
            "event_id": uuid.uuid4().hex,
        }
        await asyncio.to_thread(_write, blobs, f["upload_id"], data)
        try:
            committed = await groups.run(commit_unit(f), (TENANT, FOLDER))
        except Refused as refused:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(refused))
        _TOTALS.unpublished.append(f["event_id"])
        answer = upload_pb2.UploadFileResponse()
        up = answer.upload
        up.upload_id, up.file_id, up.file_version, up.final_checksum = committed
        up.status = upload_pb2.UPLOAD_STATUS_COMPLETED
        FILES.inc()
        if rpc:
            log.info("upload_file_committed", upload_id=f["upload_id"], size=f["size"])
        return answer

    def wrap(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        return wrap_handler(handler, f"/{SERVICE}/UploadFile", None) if rpc else handler

    await serve_upload_file(port, upload_file, wrap=wrap)


def main() -> None:
    parser = floor_arguments(__doc__)
    parser.add_argument("--rpc", action="store_true", help="Serentak's RPC wrapper and logs")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.folder, args.rpc))


if __name__ == "__main__":
    main()
