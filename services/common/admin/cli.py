"""The admin command line: `python -m services.common.admin --address HOST:PORT COMMAND`.

    stats                                   queue depth/lag per job type, outbox, DLQ
    dead-letters [--job-type T] [--limit N] [--show-traceback]
    replay ID                               queue a dead letter again (once)
    purge [--job-type T] [--older-than ISO] delete dead letters

Admin RPCs need the ops role. Without `--token`, the token and TLS files come from the
settings (read once): `SERENTAK_CLIENT_TOKEN[_FILE]`, or in dev mode the `ops` dev token
(`dev-ops`); `SERENTAK_TLS_CA_FILE` etc. `--ca/--cert/--key` override the TLS files.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

import grpc
from google.protobuf import timestamp_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from rich.console import Console
from rich.table import Table
from serentak.admin.v1 import admin_pb2, admin_pb2_grpc
from serentak.channels import checked_target, open_sync_channel
from serentak.credentials import ClientSecurity, operator_security

from services.common.channels import client_settings
from services.common.config import CommonSettings, ConfigError, load

EXIT_RPC_ERROR = 2


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Arguments of the admin CLI (added to `parser` when given)."""
    parser = parser or argparse.ArgumentParser(
        prog="python -m services.common.admin", description="Job queue administration."
    )
    parser.add_argument("--address", required=True, help="host:port of the service")
    parser.add_argument("--token", default=None, help="ops token (default: settings)")
    parser.add_argument("--ca", default=None, help="CA of a TLS server (default: settings)")
    parser.add_argument("--cert", default=None, help="client certificate for mTLS")
    parser.add_argument("--key", default=None, help="client key for mTLS")
    parser.add_argument(
        "--tls-server-name",
        default="",
        help="name the server's certificate carries, verified instead of --address "
        "(needed for a list of IPs over TLS)",
    )
    parser.add_argument("--timeout", type=float, default=10.0)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("stats", help="queue depth and lag per job type")
    dl = commands.add_parser("dead-letters", help="list dead letters")
    dl.add_argument("--job-type", default="")
    dl.add_argument("--limit", type=int, default=50)
    dl.add_argument("--show-traceback", action="store_true")
    replay = commands.add_parser("replay", help="queue a dead letter again")
    replay.add_argument("id", type=int)
    purge = commands.add_parser("purge", help="delete dead letters")
    purge.add_argument("--job-type", default="")
    purge.add_argument("--older-than", type=_iso_datetime, default=None)
    return parser


def _iso_datetime(text: str) -> datetime:
    value = datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _when(ts: timestamp_pb2.Timestamp) -> str:
    if not ts.seconds and not ts.nanos:
        return "-"
    return ts.ToDatetime(tzinfo=UTC).isoformat(timespec="seconds")


def _stats(stub: admin_pb2_grpc.AdminServiceStub, args: argparse.Namespace, md, console) -> None:  # type: ignore[no-untyped-def]
    resp = stub.QueueStats(admin_pb2.QueueStatsRequest(), metadata=md, timeout=args.timeout)
    table = Table(title="Job queue")
    for column in ("job type", "queued", "running", "lag (s)", "dead letters"):
        table.add_column(column, justify="left" if column == "job type" else "right")
    for t in resp.job_types:
        table.add_row(
            t.job_type, str(t.queued), str(t.running), f"{t.lag_seconds:.1f}", str(t.dead_letters)
        )
    console.print(table)
    console.print(
        f"unpublished events: {resp.unpublished_events}  "
        f"oldest: {resp.oldest_unpublished_event_age_seconds:.1f} s  "
        f"dead letters: {resp.dead_letter_count}"
    )


def _dead_letters(stub, args, md, console) -> None:  # type: ignore[no-untyped-def]
    resp = stub.ListDeadLetters(
        admin_pb2.ListDeadLettersRequest(job_type=args.job_type, page_size=args.limit),
        metadata=md,
        timeout=args.timeout,
    )
    table = Table(title="Dead letters")
    for column in (
        "id",
        "job type",
        "key",
        "class",
        "error",
        "attempts",
        "worker",
        "dead at",
        "replayed",
        "correlation id",
    ):
        table.add_column(column)
    for d in resp.dead_letters:
        table.add_row(
            str(d.id),
            d.job_type,
            d.partition_key,
            d.error_class,
            f"{d.error_type.rsplit('.', 1)[-1]}: {d.error_message}"[:80],
            str(d.attempts),
            d.worker_id,
            _when(d.dead_at),
            _when(d.replayed_at),
            d.correlation_id,
        )
    console.print(table)
    if args.show_traceback:
        for d in resp.dead_letters:
            console.print(f"[bold]#{d.id}[/bold] payload={d.payload_json}\n{d.traceback}")
    if resp.next_page_token:
        console.print(f"more after id {resp.next_page_token}")


def _replay(stub, args, md, console) -> None:  # type: ignore[no-untyped-def]
    resp = stub.ReplayDeadLetter(
        admin_pb2.ReplayDeadLetterRequest(id=args.id), metadata=md, timeout=args.timeout
    )
    if resp.enqueued:
        console.print(f"dead letter {args.id} queued again as job {resp.job_id}")
    else:
        console.print(
            f"dead letter {args.id} was already replayed (job {resp.job_id}); nothing queued"
        )


def _purge(stub, args, md, console) -> None:  # type: ignore[no-untyped-def]
    request = admin_pb2.PurgeDeadLettersRequest(job_type=args.job_type)
    if args.older_than is not None:
        request.older_than.FromDatetime(args.older_than)
    resp = stub.PurgeDeadLetters(request, metadata=md, timeout=args.timeout)
    console.print(f"purged {resp.purged} dead letters")


def _security(args: argparse.Namespace) -> ClientSecurity:
    """Flags first; the settings (TLS files, the ops principal's token) for what is not
    given (`serentak.credentials.operator_security`, as `serentak admin` does)."""
    settings = client_settings(load(CommonSettings))
    security = operator_security(settings, args.token, args.ca, args.cert, args.key)
    security = security.with_server_name(args.tls_server_name)
    checked_target(args.address, security)  # a list over TLS needs the name: said here
    return security


_COMMANDS = {"stats": _stats, "dead-letters": _dead_letters, "replay": _replay, "purge": _purge}


def run(args: argparse.Namespace, console: Console | None = None) -> int:
    """Execute one parsed command; returns the process exit code."""
    console = console or Console()
    md: list[tuple[str, str]] = []  # the token goes as call credentials
    try:
        security = _security(args)
    except ConfigError as exc:
        console.print(f"[red]{exc}[/red]")
        return EXIT_RPC_ERROR
    with open_sync_channel(args.address, security) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        try:
            _COMMANDS[args.command](stub, args, md, console)
        except grpc.RpcError as exc:
            status = rpc_status.from_call(exc)  # type: ignore[arg-type]
            reason = ""
            if status is not None:
                for detail in status.details:
                    info = error_details_pb2.ErrorInfo()
                    if detail.Unpack(info):
                        reason = f" ({info.reason})"
            console.print(f"[red]{exc.code().name}{reason}: {exc.details()}[/red]")  # type: ignore[attr-defined]
            return EXIT_RPC_ERROR
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m services.common.admin`."""
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
