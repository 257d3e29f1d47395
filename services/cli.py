"""`serentak`: upload (resumable, parallel, with a progress bar), download, ls, status, audit.

Resuming: `upload` derives its client_request_id from the file's path, size and mtime, so
re-running it after a kill gets the same upload back from CreateUpload and sends only the
ranges GetUpload reports missing.
"""

# The CLI is one user's process: blocking local file I/O inside its coroutines is fine.
# ruff: noqa: ASYNC230, ASYNC240

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sys
from pathlib import Path

import grpc
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc

from services.common.channels import open_channel, user_client_security

DEFAULT_ADDRESS = "127.0.0.1:50051"
DEFAULT_CHUNK = 8 * 1024 * 1024
_UNAVAILABLE_HINT = (
    "hint: is the server up at --address? A TLS server needs --ca; "
    "without --ca only loopback addresses are reached (plaintext)."
)
_DONE = (upload_pb2.UPLOAD_STATUS_COMPLETED, upload_pb2.UPLOAD_STATUS_FAILED)


def _size(text: str) -> int:
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    t = text.strip().lower().rstrip("ib")
    return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)


def _channel(args: argparse.Namespace) -> grpc.aio.Channel:
    limit = 64 * 1024 * 1024
    # The token rides as call credentials: gRPC sends it only over TLS or to loopback.
    security = user_client_security(args.token, args.ca, args.cert, args.key)
    return open_channel(
        args.address,
        security,
        options=[
            ("grpc.max_send_message_length", limit),
            ("grpc.max_receive_message_length", limit),
        ],
    )


async def upload(args: argparse.Namespace, md: tuple[tuple[str, str], ...]) -> int:
    """Upload (or resume uploading) one file."""
    path = Path(args.file)
    st = path.stat()
    chunk = args.chunk_size
    total = max(1, -(-st.st_size // chunk))
    request_id = hashlib.sha256(
        f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}:{chunk}".encode()
    ).hexdigest()[:40]
    async with _channel(args) as channel:
        stub = upload_pb2_grpc.UploadServiceStub(channel)
        created = await stub.CreateUpload(
            upload_pb2.CreateUploadRequest(
                client_request_id=request_id,
                new_file=upload_pb2.NewFileTarget(folder_id=args.folder or "", name=path.name),
                total_chunks=total,
                total_size=st.st_size,
                chunk_size=chunk,
            ),
            metadata=md,
        )
        state = await stub.GetUpload(
            upload_pb2.GetUploadRequest(upload_id=created.upload_id), metadata=md
        )
        todo = [i for r in state.missing_ranges for i in range(r.start, r.end)]
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in todo:
            queue.put_nowait(i)
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            transient=not sys.stderr.isatty(),
        ) as progress:
            bar = progress.add_task(
                path.name,
                total=st.st_size,
                completed=st.st_size - sum(_chunk_len(i, chunk, st.st_size) for i in todo),
            )

            async def sender() -> None:
                with open(path, "rb") as f:
                    while not queue.empty():
                        i = queue.get_nowait()
                        f.seek(i * chunk)
                        data = f.read(chunk)
                        await stub.PutChunk(
                            upload_pb2.PutChunkRequest(
                                upload_id=created.upload_id,
                                chunk_index=i,
                                data=data,
                                checksum=hashlib.sha256(data).hexdigest(),
                            ),
                            metadata=md,
                        )
                        progress.advance(bar, len(data))

            await asyncio.gather(*(sender() for _ in range(max(1, args.parallel))))
        while True:
            state = await stub.GetUpload(
                upload_pb2.GetUploadRequest(upload_id=created.upload_id), metadata=md
            )
            if state.status in _DONE:
                break
            await asyncio.sleep(0.2)
    if state.status == upload_pb2.UPLOAD_STATUS_FAILED:
        print(f"upload {state.upload_id} failed: {state.failure_reason}", file=sys.stderr)
        return 1
    print(
        f"{state.upload_id} completed: file {state.file_id} "
        f"version {state.file_version} {state.final_checksum}"
    )
    return 0


def _chunk_len(index: int, chunk: int, size: int) -> int:
    return max(0, min(chunk, size - index * chunk))


async def status(args: argparse.Namespace, md: tuple[tuple[str, str], ...]) -> int:
    """Print one upload's state."""
    async with _channel(args) as channel:
        u = await upload_pb2_grpc.UploadServiceStub(channel).GetUpload(
            upload_pb2.GetUploadRequest(upload_id=args.upload_id), metadata=md
        )
    missing = ", ".join(f"{r.start}-{r.end - 1}" for r in u.missing_ranges) or "none"
    print(
        f"{u.upload_id} {upload_pb2.UploadStatus.Name(u.status)} "
        f"{u.received_chunk_count}/{u.total_chunks} "
        f"missing: {missing} file: {u.file_id} v{u.file_version} {u.failure_reason}"
    )
    return 0


async def ls(args: argparse.Namespace, md: tuple[tuple[str, str], ...]) -> int:
    """List a folder (default: the caller's root)."""
    async with _channel(args) as channel:
        stub = upload_pb2_grpc.FileServiceStub(channel)
        token = ""
        while True:
            page = await stub.ListFolder(
                upload_pb2.ListFolderRequest(folder_id=args.folder or "", page_token=token),
                metadata=md,
            )
            for f in page.files:
                kind = "d" if f.kind == upload_pb2.FILE_KIND_FOLDER else "-"
                print(f"{kind} {f.file_id} v{f.version:<4} {f.size:>12} {f.name}")
            token = page.next_page_token
            if not token:
                return 0


async def download(args: argparse.Namespace, md: tuple[tuple[str, str], ...]) -> int:
    """Download a file and verify its sha256 against the trailing checksum."""
    out = Path(args.output)
    async with _channel(args) as channel:
        call = upload_pb2_grpc.FileServiceStub(channel).Download(
            upload_pb2.DownloadRequest(file_id=args.file_id), metadata=md
        )
        digest = hashlib.sha256()
        with open(out, "wb") as f:
            async for block in call:
                f.write(block.data)
                digest.update(block.data)
        trailing = dict(await call.trailing_metadata() or ())
    if (
        trailing.get("x-checksum-algorithm") == "sha256"
        and trailing.get("x-checksum") != digest.hexdigest()
    ):
        print("checksum mismatch", file=sys.stderr)
        return 1
    print(f"{out}: {digest.hexdigest()}")
    return 0


async def audit(args: argparse.Namespace, md: tuple[tuple[str, str], ...]) -> int:
    """Run AuditUploads (service token) and print its findings; 1 when unhealthy."""
    async with _channel(args) as channel:
        report = await upload_pb2_grpc.UploadAdminServiceStub(channel).AuditUploads(
            upload_pb2.AuditUploadsRequest(sample_size=args.sample), metadata=md
        )
    table = Table(title="upload audit")
    for column in ("check", "upload / file", "detail", "result"):
        table.add_column(column)
    for d in report.duplicate_chunks:
        table.add_row(
            "duplicate chunk rows", d.upload_id, f"index {d.chunk_index}: {d.rows} rows", "FAIL"
        )
    for m in report.count_mismatches:
        status = upload_pb2.UploadStatus.Name(m.status).removeprefix("UPLOAD_STATUS_").lower()
        detail = (
            f"{status}: {m.distinct_stored_chunks} stored, "
            f"{m.received_chunk_count} counted, {m.total_chunks} expected"
        )
        table.add_row("chunk count", m.upload_id, detail, "FAIL")
    for u in report.missing_chunks:
        ranges = ", ".join(
            str(r.start) if r.end == r.start + 1 else f"{r.start}-{r.end - 1}"
            for r in u.missing_ranges
        )
        detail = f"{u.received_chunk_count}/{u.total_chunks}; missing {ranges or 'none'}"
        table.add_row("uploading", u.upload_id, detail, "info")
    for c in report.checksum_checks:
        detail = c.error or f"{c.algorithm} {c.recorded_checksum[:16]}"
        if not c.ok and not c.error:
            detail += f" != {c.actual_checksum[:16]}"
        table.add_row("re-hash", c.file_id, detail, "ok" if c.ok else "FAIL")
    console = Console()
    console.print(table)
    console.print("healthy" if report.healthy else "UNHEALTHY")
    return 0 if report.healthy else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `serentak` console script."""
    p = argparse.ArgumentParser(prog="serentak")
    p.add_argument("--address", default=os.environ.get("SERENTAK_UPLOAD_ADDRESS", DEFAULT_ADDRESS))
    p.add_argument(
        "--token",
        default=os.environ.get("SERENTAK_TOKEN", "dev-alice"),
        help="bearer token: a JWT in jwt mode (default $SERENTAK_TOKEN, else dev-alice)",
    )
    p.add_argument(
        "--ca",
        default=os.environ.get("SERENTAK_TLS_CA_FILE"),
        help="CA certificate (PEM) of a TLS server; without it, plaintext to loopback only",
    )
    p.add_argument("--cert", default=os.environ.get("SERENTAK_TLS_CLIENT_CERT_FILE"))
    p.add_argument("--key", default=os.environ.get("SERENTAK_TLS_CLIENT_KEY_FILE"))
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("upload", help="upload FILE in chunks (resumable; re-run to resume)")
    up.add_argument("file")
    up.add_argument("--folder", default="")
    up.add_argument("--parallel", type=int, default=4)
    up.add_argument("--chunk-size", type=_size, default=DEFAULT_CHUNK)
    st = sub.add_parser("status", help="show an upload: status, received, missing ranges")
    st.add_argument("upload_id")
    ls_p = sub.add_parser("ls", help="list a folder (default: your root)")
    ls_p.add_argument("folder", nargs="?", default="")
    dl = sub.add_parser("download", help="download a file and verify its checksum")
    dl.add_argument("file_id")
    dl.add_argument("output")
    au = sub.add_parser("audit", help="store audit (needs an ops token, e.g. dev-ops)")
    au.add_argument("--sample", type=int, default=0, help="completed files to re-hash")
    args = p.parse_args(argv)
    md: tuple[tuple[str, str], ...] = ()  # the token goes as call credentials
    commands = {"upload": upload, "status": status, "ls": ls, "download": download, "audit": audit}
    command = commands[args.command]
    try:
        return asyncio.run(command(args, md))
    except grpc.aio.AioRpcError as exc:
        print(f"{exc.code().name}: {exc.details()}", file=sys.stderr)
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            print(_UNAVAILABLE_HINT, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
