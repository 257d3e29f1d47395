"""`serentak admin audit-trail` (and `admin audit` given a filter): the audit trail.

Newest first, `--limit` events at most (pages of the ListAuditEvents RPC followed until
then), filtered by `--tenant`, `--user` (a user id, or `service:{name}`), `--file` (any
target id) and `--since` / `--until` (ISO 8601, UTC unless it says otherwise, or an age
like 30m, 12h, 7d). `--json` prints {"events": [...], "next_page_token": ...}.
"""

from __future__ import annotations

import argparse
import json
import re
from datetime import datetime, timedelta, timezone

import grpc
from google.protobuf import timestamp_pb2

from serentak.admin.v1 import admin_pb2, admin_pb2_grpc
from serentak.cli.output import EXIT_OK, Output, message_dict

FILTERS = ("tenant", "user", "file", "since", "until")
PAGE = 500
_AGE = re.compile(r"^(\d+)([smhd])$")
_UNIT = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def instant(text: str) -> datetime:
    """`2026-12-01`, `2026-12-01T08:00:00+01:00` (UTC if no offset) or an age: `7d` ago."""
    age = _AGE.match(text.strip())
    if age:
        ago = timedelta(**{_UNIT[age.group(2)]: int(age.group(1))})
        return datetime.now(timezone.utc) - ago
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time (ISO 8601, e.g. 2026-12-01T08:00, or an age: 30m, 7d)"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _timestamp(when: datetime | None) -> timestamp_pb2.Timestamp | None:
    if when is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(when.astimezone(timezone.utc))
    return ts


def wanted(args: argparse.Namespace) -> bool:
    """True when `admin audit` was given a trail filter (then it shows the trail)."""
    return any(getattr(args, name, None) for name in FILTERS)


async def show(args: argparse.Namespace, channel: grpc.aio.Channel, out: Output) -> int:
    """Print up to `--limit` events of the trail matching the filters, newest first."""
    stub = admin_pb2_grpc.AdminServiceStub(channel)
    events: list[admin_pb2.AuditEvent] = []
    token = ""
    while len(events) < args.limit:
        page = await stub.ListAuditEvents(
            admin_pb2.ListAuditEventsRequest(
                tenant_id=args.tenant or "",
                principal=args.user or "",
                target_id=args.file or "",
                since=_timestamp(args.since),
                until=_timestamp(args.until),
                page_size=min(PAGE, args.limit - len(events)),
                page_token=token,
            ),
            timeout=args.timeout,
        )
        events.extend(page.events)
        token = page.next_page_token
        if not token:
            break
    out.document = {
        "events": [message_dict(e) for e in events],
        "next_page_token": token,
    }
    for e in events:
        when = e.at.ToDatetime(tzinfo=timezone.utc).strftime("%m-%d %H:%M:%S")
        out.line(f"{when} {e.tenant_id[:10]:<10} {e.principal[:14]:<14} {e.action[:20]:<20}")
        detail = json.loads(e.detail_json or "{}")
        extras = " ".join(f"{k}={v}" for k, v in detail.items() if k != "grants")
        out.line(f"    {e.target_type} {e.target_id} {extras}"[:80])
    if not events:
        out.note("no audit events match")
    elif token:
        out.note(f"more events: raise --limit (shown {len(events)})")
    return EXIT_OK
