"""`serentak admin ...`: job-queue stats, dead letters, replay, purge, the upload audit and
the audit trail (`audit_trail.py`).

The address comes from the settings (`SERENTAK_UPLOAD_ADDRESS` / `SERENTAK_NOTIFY_ADDRESS`)
unless `--address` is given; the token is `--token`, else `SERENTAK_TOKEN` (as for every
other command), else the ops principal's from the settings (`SERENTAK_CLIENT_TOKEN[_FILE]`,
dev mode: `dev-ops`); a `--cert` given is the credential on its own.
Output fits 80 columns; `--json` prints the responses as JSON.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone

import grpc

from serentak.admin.v1 import admin_pb2, admin_pb2_grpc
from serentak.channels import open_channel
from serentak.cli import audit_trail
from serentak.cli.output import EXIT_FAILED, EXIT_OK, Output, message_dict
from serentak.credentials import operator_security
from serentak.settings import ClientSettings
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc


def _address(args: argparse.Namespace, settings: ClientSettings) -> str:
    if "address" in args.given:
        return str(args.address)
    return settings.notify_address if args.service == "notify" else settings.upload_address


def _server_name(args: argparse.Namespace, settings: ClientSettings) -> str:
    if args.tls_server_name:
        return str(args.tls_server_name)
    if args.service == "notify":
        return settings.notify_tls_server_name
    return settings.upload_tls_server_name


def _when(ts: object) -> str:
    if not getattr(ts, "seconds", 0):
        return "-"
    # timezone.utc: datetime.UTC is 3.11+.
    when: datetime = ts.ToDatetime(tzinfo=timezone.utc)  # type: ignore[attr-defined]
    return when.strftime("%m-%d %H:%M")


async def run(args: argparse.Namespace, out: Output) -> int:
    """Execute one `serentak admin` command."""
    settings = ClientSettings.from_environ()
    security = operator_security(
        settings,
        token=args.token if "token" in args.chosen else None,
        ca_file=args.ca if "ca" in args.given else None,
        cert_file=args.cert if "cert" in args.given else None,
        key_file=args.key if "key" in args.given else None,
    ).with_server_name(_server_name(args, settings))
    async with open_channel(_address(args, settings), security) as channel:
        if args.admin_command == "audit-trail" or (
            args.admin_command == "audit" and audit_trail.wanted(args)
        ):
            return await audit_trail.show(args, channel, out)
        if args.admin_command == "audit":
            return await _audit(args, channel, out)
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        t = args.timeout
        if args.admin_command == "stats":
            r = await stub.QueueStats(admin_pb2.QueueStatsRequest(), timeout=t)
            out.document = message_dict(r)
            out.line(f"{'job type':<28} {'queued':>7} {'running':>7} {'lag s':>8} {'dead':>6}")
            for j in r.job_types:
                out.line(
                    f"{j.job_type[:28]:<28} {j.queued:>7} {j.running:>7} "
                    f"{j.lag_seconds:>8.1f} {j.dead_letters:>6}"
                )
            out.line(
                f"unpublished events: {r.unpublished_events} "
                f"(oldest {r.oldest_unpublished_event_age_seconds:.1f} s), "
                f"dead letters: {r.dead_letter_count}"
            )
        elif args.admin_command == "dead-letters":
            r = await stub.ListDeadLetters(
                admin_pb2.ListDeadLettersRequest(job_type=args.job_type, page_size=args.limit),
                timeout=t,
            )
            out.document = message_dict(r)
            for d in r.dead_letters:
                replayed = "replayed" if d.replayed_at.seconds else ""
                out.line(
                    f"#{d.id:<6} {d.job_type[:22]:<22} {_when(d.dead_at)} x{d.attempts} {replayed}"
                )
                error = f"{d.error_type.rsplit('.', 1)[-1]}: {d.error_message}"
                out.line(f"        {error[:70]}")
            if not r.dead_letters:
                out.note("no dead letters")
        elif args.admin_command == "replay":
            r = await stub.ReplayDeadLetter(
                admin_pb2.ReplayDeadLetterRequest(id=args.id), timeout=t
            )
            out.document = message_dict(r)
            out.line(
                f"dead letter {args.id} queued again as job {r.job_id}"
                if r.enqueued
                else f"dead letter {args.id} was already replayed (job {r.job_id})"
            )
        elif args.admin_command == "purge":
            r = await stub.PurgeDeadLetters(
                admin_pb2.PurgeDeadLettersRequest(job_type=args.job_type), timeout=t
            )
            out.document = message_dict(r)
            out.line(f"purged {r.purged} dead letters")
    return EXIT_OK


async def _audit(args: argparse.Namespace, channel: grpc.aio.Channel, out: Output) -> int:
    report = await upload_pb2_grpc.UploadAdminServiceStub(channel).AuditUploads(
        upload_pb2.AuditUploadsRequest(sample_size=args.sample), timeout=args.timeout
    )
    out.document = message_dict(report)
    out.document["healthy"] = report.healthy
    for d in report.duplicate_chunks:
        out.line(f"FAIL duplicate chunk rows  {d.upload_id} index {d.chunk_index}: {d.rows}")
    for m in report.count_mismatches:
        out.line(
            f"FAIL chunk count  {m.upload_id}: {m.distinct_stored_chunks} stored, "
            f"{m.received_chunk_count} counted, {m.total_chunks} expected"
        )
    for u in report.missing_chunks:
        out.line(f"info uploading  {u.upload_id}: {u.received_chunk_count}/{u.total_chunks}")
    for c in report.checksum_checks:
        out.line(f"{'ok  ' if c.ok else 'FAIL'} re-hash  {c.file_id} {c.error}")
    out.line("healthy" if report.healthy else "UNHEALTHY")
    return EXIT_OK if report.healthy else EXIT_FAILED
