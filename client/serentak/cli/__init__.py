"""`serentak`: the command line over the SDK (`serentak.sdk`).

    serentak [global flags] COMMAND [args] [global flags]

Commands: upload, uploads, abort, status, ls, shared, download, versions, share, unshare,
collaborators, mkdir, mv, rm, restore, watch, changes, admin. `--json` prints one JSON
document on stdout (watch, changes --follow: one object a line); messages and progress go
to stderr. Exit codes: see `serentak.cli.output` and `serentak --help`. A reader that
closes stdout early (`| head`) ends the command quietly with 141, as SIGPIPE ends a C tool.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable

import grpc

from serentak.cli import admin, changes, commands, tree, versions, watch
from serentak.cli.output import (
    EXIT_BROKEN_PIPE,
    EXIT_CORRUPT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    Output,
    exit_code_for,
)
from serentak.cli.parser import parse
from serentak.errors import ConfigError
from serentak.sdk import ChecksumMismatch, SerentakClient
from serentak.sdk.results import rpc_reason

Command = Callable[[argparse.Namespace, SerentakClient, Output], Awaitable[int]]

COMMANDS: dict[str, Command] = {
    "upload": commands.upload,
    "uploads": commands.uploads,
    "abort": commands.abort,
    "status": commands.status,
    "ls": commands.ls,
    "shared": commands.shared,
    "download": commands.download,
    "versions": versions.versions,
    "share": commands.share,
    "unshare": commands.unshare,
    "collaborators": commands.collaborators,
    "mkdir": tree.mkdir,
    "mv": tree.mv,
    "rm": tree.rm,
    "restore": tree.restore,
    "watch": watch.watch,
    "changes": changes.changes,
}

_UNAVAILABLE_HINT = (
    "hint: is the server up at --address? A TLS server needs --ca; "
    "without --ca only loopback addresses are reached (plaintext)."
)


async def _run(args: argparse.Namespace, out: Output) -> int:
    if args.command in ("admin", "audit"):
        return await admin.run(args, out)
    client = SerentakClient(
        args.address,
        token=args.token,
        ca_file=args.ca,
        cert_file=args.cert,
        key_file=args.key,
        notify_address=watch.address(args) if args.command == "watch" else None,
        tls_server_name=args.tls_server_name,
        notify_tls_server_name=watch.tls_server_name(args) if args.command == "watch" else "",
    )
    async with client:
        return await COMMANDS[args.command](args, client, out)


def _rpc_error(exc: grpc.aio.AioRpcError) -> CliError:
    reason, metadata = rpc_reason(exc)
    code = exc.code()
    hint = ""
    if reason == "NAME_TAKEN":
        hint = commands.name_taken_hint(metadata)
    elif reason == "USER_ID_IS_A_TOKEN" and metadata.get("user_id"):
        hint = f"share with the user id instead: {metadata['user_id']}"
    elif reason == "CLIENT_REQUEST_ID_REUSED":
        hint = "the file changed since that upload began; start again (touch it) or --resume"
    elif reason in ("VERSION_PURGED", "VERSION_NOT_FOUND"):
        hint = "`serentak versions FILE_ID` lists the versions and which are still kept"
    elif code == grpc.StatusCode.UNAVAILABLE:
        hint = _UNAVAILABLE_HINT
    label = code.name + (f"/{reason}" if reason else "")
    return CliError(f"{label}: {exc.details()}", exit_code_for(code), reason=reason, hint=hint)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `serentak` console script; returns the exit code."""
    args = parse(argv)
    out = Output(json_mode=args.json)
    try:
        code = asyncio.run(_run(args, out))
        out.emit()
        return code
    except BrokenPipeError:
        return _stdout_closed()
    except KeyboardInterrupt:
        if args.command == "watch":
            resume = f" --cursor {watch.WatchRun.cursor}" if watch.WatchRun.cursor else ""
            out.note(f"stopped; resume with: serentak watch{resume}")
            return EXIT_OK
        if args.command == "changes":
            resume = f" --cursor {changes.ChangesRun.cursor}" if changes.ChangesRun.cursor else ""
            out.note(f"stopped; resume with: serentak changes --follow{resume}")
            return EXIT_OK
        message = "interrupted"
        upload_id = commands.UploadRun.upload_id
        if args.command == "upload" and upload_id:
            message += (
                f"; upload {upload_id} kept. Resume with: "
                f"serentak upload {commands.UploadRun.file} --resume {upload_id}"
            )
        error = CliError(message, EXIT_INTERRUPTED, reason="INTERRUPTED")
    except CliError as exc:
        error = exc
    except grpc.aio.AioRpcError as exc:
        error = _rpc_error(exc)
    except ChecksumMismatch as exc:
        error = CliError(
            f"checksum mismatch, nothing kept: {exc}", EXIT_CORRUPT, reason="CHECKSUM_MISMATCH"
        )
    except (ConfigError, ValueError, OSError) as exc:
        error = CliError(str(exc), EXIT_USAGE)
    try:
        return _fail(out, error)
    except BrokenPipeError:
        return _stdout_closed()


def _stdout_closed() -> int:
    """The reader went away (`serentak ls | head`): nothing more to say, to anyone.

    stdout is pointed at /dev/null so the interpreter's own flush at exit does not fail
    again with the "Exception ignored ... BrokenPipeError" it would print.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


def _fail(out: Output, error: CliError) -> int:
    print(f"serentak: {error}", file=sys.stderr)
    if error.hint:
        print(error.hint, file=sys.stderr)
    if out.json_mode:
        out.document = {
            **out.document,
            "error": {
                "message": str(error),
                "reason": error.reason,
                "exit_code": error.exit_code,
                "hint": error.hint,
            },
        }
        out.emit()
    return error.exit_code
