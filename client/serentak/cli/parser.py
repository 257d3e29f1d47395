"""The `serentak` argument parser: global flags accepted before or after the subcommand."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from importlib import metadata

from serentak.cli.audit_trail import instant
from serentak.cli.output import EXIT_CODES_HELP

DEFAULT_ADDRESS = "127.0.0.1:50051"
DEFAULT_NOTIFY_ADDRESS = "127.0.0.1:50053"
DEFAULT_CHUNK = 8 * 1024 * 1024
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gib": 1024**3,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$")


def size(text: str) -> int:
    """`8MiB`, `512k`, `1024` -> bytes (binary units); at least 1 byte."""
    m = _SIZE.match(text.lower())
    if not m or m.group(2) not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size (use bytes or KiB/MiB/GiB, e.g. 8MiB)"
        )
    value = int(float(m.group(1)) * _UNITS[m.group(2)])
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1 byte")
    return value


def positive(text: str) -> int:
    """A positive integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def version() -> str:
    """The installed package's version."""
    try:
        return metadata.version("serentak")
    except metadata.PackageNotFoundError:
        return "unknown"


# Defaults of the global flags; the parsers leave them unset (SUPPRESS) so a flag given
# after the subcommand is not overwritten by the top-level default, and the reverse.
_ENVIRONMENT = {
    "address": "SERENTAK_UPLOAD_ADDRESS",
    "token": "SERENTAK_TOKEN",
    "ca": "SERENTAK_TLS_CA_FILE",
    "cert": "SERENTAK_TLS_CLIENT_CERT_FILE",
    "key": "SERENTAK_TLS_CLIENT_KEY_FILE",
    "tls_server_name": "SERENTAK_UPLOAD_TLS_SERVER_NAME",
}


def global_defaults() -> dict[str, object]:
    """Defaults of the global flags (the CLI's environment: SERENTAK_UPLOAD_ADDRESS, ...)."""
    env = os.environ
    return {
        "address": env.get(_ENVIRONMENT["address"], DEFAULT_ADDRESS),
        "token": env.get(_ENVIRONMENT["token"], "dev-alice"),
        "ca": env.get(_ENVIRONMENT["ca"]),
        "cert": env.get(_ENVIRONMENT["cert"]),
        "key": env.get(_ENVIRONMENT["key"]),
        "tls_server_name": env.get(_ENVIRONMENT["tls_server_name"], ""),
        "json": False,
        "no_progress": False,
    }


def notify_address() -> str:
    """The notify service for `watch`: $SERENTAK_NOTIFY_ADDRESS, else 127.0.0.1:50053."""
    return os.environ.get("SERENTAK_NOTIFY_ADDRESS", DEFAULT_NOTIFY_ADDRESS)


def notify_tls_server_name() -> str:
    """The TLS name `watch` verifies notify by: $SERENTAK_NOTIFY_TLS_SERVER_NAME, else none."""
    return os.environ.get("SERENTAK_NOTIFY_TLS_SERVER_NAME", "")


class _Parser(argparse.ArgumentParser):
    """argparse, plus the `--json` error document on stdout for a usage error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if _JSON_REQUESTED[0]:
            error = {"message": message, "reason": "USAGE", "exit_code": 2, "hint": ""}
            print(json.dumps({"error": error}, indent=2, sort_keys=True), flush=True)
        super().error(message)


# Set by `parse` when its argv holds --json (argv need not be sys.argv).
_JSON_REQUESTED = [False]


def _globals() -> _Parser:
    g = _Parser(add_help=False)
    s = argparse.SUPPRESS
    g.add_argument(
        "--address",
        default=s,
        help="upload service host:port (default $SERENTAK_UPLOAD_ADDRESS, else 127.0.0.1:50051)",
    )
    g.add_argument(
        "--token",
        default=s,
        help="bearer token: a JWT in jwt mode (default $SERENTAK_TOKEN, else dev-alice)",
    )
    g.add_argument(
        "--ca",
        default=s,
        help="CA certificate (PEM) of a TLS server; without it, plaintext to loopback only",
    )
    g.add_argument("--cert", default=s, help="client certificate (mTLS)")
    g.add_argument("--key", default=s, help="client key (mTLS)")
    g.add_argument(
        "--tls-server-name",
        default=s,
        help="name the server's certificate carries, verified instead of --address (needed "
        "for a list of IPs; default $SERENTAK_UPLOAD_TLS_SERVER_NAME)",
    )
    g.add_argument(
        "--json",
        action="store_true",
        default=s,
        help="print one JSON document on stdout (messages stay on stderr)",
    )
    g.add_argument("--no-progress", action="store_true", default=s, help="no progress on stderr")
    return g


def build_parser() -> argparse.ArgumentParser:
    """The full parser (global flags on the top level and on every subcommand)."""
    common = _globals()
    p = _Parser(
        prog="serentak",
        parents=[common],
        description="Serentak files from the command line.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"serentak {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            parents=[common],
            help=help_text,
            description=help_text,
            epilog=EXIT_CODES_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    up = command("upload", "upload FILE (resumable: re-run, or --resume ID)")
    up.add_argument("file")
    up.add_argument("--folder", default="", help="folder id (default: your root)")
    up.add_argument(
        "--name",
        default="",
        help="name in the folder (default: FILE's name); "
        "a name the folder already has is refused: use --to FILE_ID for a new version",
    )
    up.add_argument(
        "--to", default="", metavar="FILE_ID", help="upload a new version of this existing file"
    )
    up.add_argument("--resume", default="", metavar="UPLOAD_ID", help="continue this upload")
    up.add_argument("--parallel", type=positive, default=4)
    up.add_argument(
        "--chunk-size",
        type=size,
        default=DEFAULT_CHUNK,
        help="chunk size in bytes or KiB/MiB (default 8MiB)",
    )
    ups = command("uploads", "list your open uploads")
    ups.add_argument("--all", action="store_true", help="every upload, not only open ones")
    ab = command("abort", "abort an open upload")
    ab.add_argument("upload_id")
    st = command("status", "show an upload: status, chunks, missing ranges")
    st.add_argument("upload_id")
    st.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait (on the server) up to SECONDS for the upload to finish before showing it",
    )
    ls_p = command("ls", "list a folder (default: your root)")
    ls_p.add_argument("folder", nargs="?", default="")
    command("shared", "files and folders shared with you")
    dl = command("download", "download a file (atomic, checksum verified)")
    dl.add_argument("file_id")
    dl.add_argument(
        "output",
        help="destination file, or a directory (existing, or any path ending in /) to "
        "download into under the file's name; a missing directory is an error",
    )
    dl.add_argument(
        "--version",
        type=positive,
        default=0,
        metavar="N",
        help="an older version (a number `serentak versions FILE_ID` lists; default: current)",
    )
    vs = command("versions", "a file's versions, newest first (current, kept, or purged)")
    vs.add_argument("file_id")
    sh = command("share", "share a file or folder with a user")
    sh.add_argument("file_id")
    sh.add_argument("user", help="a user id, e.g. bob (dev token dev-bob is user bob)")
    sh.add_argument("--role", choices=("viewer", "editor"), default="viewer")
    un = command("unshare", "take a user's share away")
    un.add_argument("file_id")
    un.add_argument("user")
    co = command("collaborators", "who has which role on a file or folder")
    co.add_argument("file_id")
    mk = command("mkdir", "create a folder (prints its id)")
    mk.add_argument("name")
    mk.add_argument("--parent", default="", metavar="FOLDER_ID", help="default: your root")
    mv = command("mv", "move a file or folder into FOLDER_ID, and/or rename it (--name)")
    mv.add_argument("file_id")
    mv.add_argument("folder_id", nargs="?", default="", help="the folder to move it into")
    mv.add_argument("--name", default="", help="a new name in its folder")
    rm = command("rm", "delete files or folders (soft: `serentak restore ID` undoes it)")
    rm.add_argument("file_ids", nargs="+", metavar="FILE_ID")
    rs = command(
        "restore",
        "undo rm; with VERSION, make that older version the file's next version",
    )
    rs.add_argument("file_id")
    rs.add_argument(
        "version",
        nargs="?",
        type=positive,
        default=None,
        help="a version number from `serentak versions FILE_ID` (omit it to undo rm)",
    )
    wa = command(
        "watch",
        "print your notifications as they happen (Ctrl-C stops; --json: one object a line)",
    )
    wa.add_argument(
        "--cursor", default="", help="resume after this cursor (printed when watch stops)"
    )
    wa.add_argument(
        "--notify-address",
        default=None,
        help="notify service host:port (default $SERENTAK_NOTIFY_ADDRESS, else 127.0.0.1:50053)",
    )
    wa.add_argument(
        "--notify-tls-server-name",
        default=None,
        help="name notify's certificate carries (default $SERENTAK_NOTIFY_TLS_SERVER_NAME)",
    )
    ch = command(
        "changes",
        "what changed in everything you can see (a snapshot first without --cursor; "
        "--follow waits for more until Ctrl-C; --json)",
    )
    ch.add_argument(
        "--cursor", default="", help="resume after this cursor (printed when changes ends)"
    )
    ch.add_argument("--follow", action="store_true", help="keep waiting for new changes")
    top_audit = command("audit", "upload store audit (= admin audit; needs an ops token)")
    top_audit.add_argument("--sample", type=int, default=0, help="completed files to re-hash")
    top_audit.set_defaults(admin_command="audit", service="upload", timeout=30.0)
    ad = command("admin", "operator commands (ops credentials from settings)")
    ad.add_argument(
        "--service",
        choices=("upload", "notify"),
        default="upload",
        help="whose job queue (address from settings unless --address)",
    )
    ad.add_argument("--timeout", type=float, default=10.0)
    adsub = ad.add_subparsers(dest="admin_command", required=True, metavar="ADMIN_COMMAND")
    adsub.add_parser("stats", parents=[common], help="queue depth and lag per job type")
    dls = adsub.add_parser("dead-letters", parents=[common], help="list dead letters")
    dls.add_argument("--job-type", default="")
    dls.add_argument("--limit", type=positive, default=50)
    rp = adsub.add_parser("replay", parents=[common], help="queue a dead letter again")
    rp.add_argument("id", type=positive)
    pg = adsub.add_parser("purge", parents=[common], help="delete dead letters")
    pg.add_argument("--job-type", default="")
    au = adsub.add_parser(
        "audit",
        parents=[common],
        help="upload store audit; given a filter (--tenant/--user/--file/--since/--until): "
        "the audit trail",
    )
    au.add_argument("--sample", type=int, default=0, help="completed files to re-hash")
    trail_flags(au)
    at = adsub.add_parser(
        "audit-trail", parents=[common], help="who changed or read what (newest first)"
    )
    trail_flags(at)
    return p


def trail_flags(p: argparse.ArgumentParser) -> None:
    """The audit trail's filters (`serentak.cli.audit_trail`)."""
    p.add_argument("--tenant", default="", help="one tenant's events")
    p.add_argument("--user", default="", help="one principal's (a user id, or service:NAME)")
    p.add_argument("--file", default="", help="one file's or folder's (any target id)")
    p.add_argument("--since", type=instant, default=None, help="ISO 8601 (UTC) or age (7d)")
    p.add_argument("--until", type=instant, default=None, help="ISO 8601 (UTC) or age (1h)")
    p.add_argument("--limit", type=positive, default=50, help="most events shown")


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Parse `argv`, filling the global flags' defaults where none was given."""
    _JSON_REQUESTED[0] = "--json" in (sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    defaults = global_defaults()
    args.given = {name for name in defaults if hasattr(args, name)}
    # Set by a flag or by its variable (`admin` tells these from its settings' defaults).
    args.chosen = args.given | {name for name, var in _ENVIRONMENT.items() if var in os.environ}
    for name, value in defaults.items():
        if not hasattr(args, name):
            setattr(args, name, value)
    return args
