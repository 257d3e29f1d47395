"""The user commands of `serentak`, each built on the SDK (`serentak.sdk`).

Each command takes the parsed arguments, an open `SerentakClient` and an `Output`; it
fills `out.document` (the `--json` result) and prints human lines; failures raise
`CliError` or let the RPC error through (main maps both to one line and an exit code).
"""

# The CLI is one user's process: blocking local file checks inside its coroutines are fine.
# ruff: noqa: ASYNC240

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from serentak.cli.output import (
    EXIT_CONFLICT,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    Output,
    ProgressLine,
    binary_size,
    message_dict,
)
from serentak.sdk import FileKind, Named, SerentakClient, UploadFailed, UploadStatus
from serentak.upload.v1 import upload_pb2

Upload = Named[upload_pb2.Upload]


def _upload_dict(u: Upload) -> dict[str, Any]:
    d = message_dict(u)
    d["status"] = str(u.status)
    return d


def _ranges(u: Upload) -> str:
    return (
        ", ".join(
            str(r.start) if r.end == r.start + 1 else f"{r.start}-{r.end - 1}"
            for r in u.missing_ranges
        )
        or "none"
    )


class UploadRun:
    """What Ctrl-C needs to say how to resume: the upload id once it exists."""

    upload_id: str = ""
    file: str = ""


async def upload(args: argparse.Namespace, client: SerentakClient, out: Output) -> int:
    """Upload FILE as a new file, a new version (--to) or resume an upload (--resume)."""
    path = Path(args.file)
    if not path.is_file():
        raise CliError(f"{args.file}: no such file", EXIT_USAGE)
    if args.resume and (args.to or args.folder or args.name):
        raise CliError(
            "--resume continues an upload's own target; drop --to/--folder/--name", EXIT_USAGE
        )
    UploadRun.file = str(path)
    bar = ProgressLine(path.name, enabled=not args.no_progress)

    def created(u: Upload) -> None:
        UploadRun.upload_id = u.upload_id
        out.note(
            f"upload {u.upload_id} ({u.status}, "
            f"{u.received_chunk_count}/{u.total_chunks} chunks stored)"
        )

    try:
        done = await client.upload(
            path,
            folder_id=args.folder,
            name=args.name or None,
            to_file_id=args.to,
            chunk_size=args.chunk_size,
            parallel=args.parallel,
            resume_upload_id=args.resume,
            progress=bar,
            on_created=created,
        )
    except UploadFailed as exc:
        out.document = {"upload": _upload_dict(exc.upload)}
        raise CliError(str(exc), EXIT_FAILED) from None
    finally:
        bar.close()
    out.document = {"upload": _upload_dict(done)}
    out.line(
        f"{done.upload_id} completed: file {done.file_id} "
        f"version {done.file_version} {done.final_checksum}"
    )
    return EXIT_OK


async def uploads(args: argparse.Namespace, client: SerentakClient, out: Output) -> int:
    """List your uploads (default: the open ones)."""
    status = UploadStatus.UNSPECIFIED if args.all else UploadStatus.UPLOADING
    rows = await client.list_uploads(status)
    out.document = {"uploads": [_upload_dict(u) for u in rows]}
    for u in rows:
        out.line(
            f"{u.upload_id}  {u.status:<9} {u.received_chunk_count}/{u.total_chunks}"
            f"  {binary_size(u.total_size):>10}  {u.name}"
        )
    if not rows:
        out.note("no open uploads" if not args.all else "no uploads")
    return EXIT_OK


async def abort(args: argparse.Namespace, client: SerentakClient, out: Output) -> int:
    """Abort an open upload."""
    u = await client.abort_upload(args.upload_id)
    out.document = {"upload": _upload_dict(u)}
    out.line(f"{u.upload_id} {u.status}")
    return EXIT_OK


async def status(args: argparse.Namespace, client: SerentakClient, out: Output) -> int:
    """One upload's state in words (with --wait: once finished, or after that long)."""
    u = await client.get_upload(args.upload_id, wait_seconds=args.wait)
    out.document = {"upload": _upload_dict(u)}
    line = (
        f"{u.upload_id}  {u.status}  {u.name}  "
        f"{u.received_chunk_count}/{u.total_chunks} chunks  missing: {_ranges(u)}"
    )
    if u.status == UploadStatus.COMPLETED:
        line += f"  file {u.file_id} version {u.file_version}"
    if u.failure_reason:
        line += f"  reason: {u.failure_reason}"
    out.line(line)
    return EXIT_OK


def file_dict(f: Named[upload_pb2.File]) -> dict[str, Any]:
    """A file for --json: its fields, with `kind` `file` or `folder`."""
    d = message_dict(f)
    d["kind"] = "folder" if f.kind == FileKind.FOLDER else "file"
    return d


async def ls(args: argparse.Namespace, client: SerentakClient, out: Output) -> int:
    """List a folder (default: your root)."""
    files = await client.list_folder(args.folder)
    out.document = {"folder_id": args.folder, "files": [file_dict(f) for f in files]}
    for f in files:
        kind = "d" if f.kind == FileKind.FOLDER else "-"
        out.line(f"{kind} {f.file_id} v{f.version:<4} {binary_size(f.size):>10} {f.name}")
    return EXIT_OK


async def shared(args: argparse.Namespace, client: SerentakClient, out: Output) -> int:
    """Files and folders others shared with you."""
    items = await client.shared_with_me()
    out.document = {
        "shared": [
            {**file_dict(s.file), "role": str(s.role), "shared_by": s.granted_by} for s in items
        ]
    }
    for s in items:
        kind = "d" if s.file.kind == FileKind.FOLDER else "-"
        out.line(f"{kind} {s.file.file_id} {s.role:<6} {s.file.owner_user_id:<12} {s.file.name}")
    return EXIT_OK


def _means_directory(output: str) -> bool:
    """`dir/` names a directory whether or not it exists (as for cp, curl and rsync)."""
    return output.endswith(os.sep) or bool(os.altsep and output.endswith(os.altsep))


async def download(args: argparse.Namespace, client: SerentakClient, out: Output) -> int:
    """Download a file atomically and verify its checksum.

    OUTPUT is the file to write, or a directory to write into under the file's own name:
    an existing directory, or any path ending in `/`. A directory that does not exist is
    an error (exit 2), as for `cp` and curl without --create-dirs: a mistyped path must
    not quietly become a new directory, nor a file named after the directory.
    """
    dest = Path(args.output)
    if dest.is_dir():
        dest = dest / (await client.get_file(args.file_id)).name
    elif _means_directory(args.output):
        problem = "not a directory" if dest.exists() else "no such directory"
        raise CliError(
            f"{args.output}: {problem}",
            EXIT_USAGE,
            hint=f"create it first (mkdir -p {args.output}), or name the file to write",
        )
    if not dest.parent.is_dir():
        raise CliError(f"{dest.parent}: no such directory", EXIT_USAGE)
    bar = ProgressLine(dest.name, enabled=not args.no_progress)
    try:
        result = await client.download(args.file_id, dest, version=args.version, progress=bar)
    finally:
        bar.close()
    out.document = {
        "version": args.version,
        "path": str(result.path),
        "size": result.size,
        "checksum": result.checksum,
        "checksum_algorithm": result.checksum_algorithm,
        "verified": result.verified,
    }
    out.line(
        f"{result.path}: {result.size} bytes, sha256 {result.checksum}"
        + ("" if result.verified else " (not verified: no sha256 from the server)")
    )
    return EXIT_OK


async def share(args: argparse.Namespace, client: SerentakClient, out: Output) -> int:
    """Share a file or folder with a user of your tenant."""
    f = await client.share(args.file_id, args.user, args.role)
    out.document = {"file": file_dict(f), "user_id": args.user, "role": args.role}
    out.line(f"{f.name} ({f.file_id}) shared with {args.user} as {args.role}")
    return EXIT_OK


async def unshare(args: argparse.Namespace, client: SerentakClient, out: Output) -> int:
    """Take a user's share away."""
    f = await client.unshare(args.file_id, args.user)
    out.document = {"file": file_dict(f), "user_id": args.user}
    out.line(f"{f.name} ({f.file_id}) no longer shared with {args.user}")
    return EXIT_OK


async def collaborators(args: argparse.Namespace, client: SerentakClient, out: Output) -> int:
    """Who has which role on a file or folder."""
    rows = await client.collaborators(args.file_id)
    out.document = {"collaborators": [{**message_dict(c), "role": str(c.role)} for c in rows]}
    for c in rows:
        out.line(f"{c.user_id:<20} {c.role:<6} granted by {c.granted_by or '-'}")
    return EXIT_OK


def name_taken_hint(metadata: dict[str, str]) -> str:
    """The documented rule for uploading a name the folder already has."""
    existing = metadata.get("existing_file_id", "")
    if existing:
        return f"to upload a new version: serentak upload FILE --to {existing}; or pick --name"
    return "pick another --name (or --to FILE_ID for a new version of a file you can write)"


__all__ = [
    "EXIT_CONFLICT",
    "UploadRun",
    "abort",
    "collaborators",
    "download",
    "file_dict",
    "ls",
    "name_taken_hint",
    "share",
    "shared",
    "status",
    "unshare",
    "upload",
    "uploads",
]
