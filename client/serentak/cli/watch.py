"""`serentak watch`: your notifications as they happen (notify's Subscribe stream).

One line per notification; `--json`: one JSON object per line (JSON Lines: a stream has
no end at which to print one document). Ctrl-C is how a watch ends, so it is not an
error: the stream is cancelled, the channel closed, the cursor to resume from printed on
stderr, and the exit code is 0 (`serentak.cli.main`).
"""

from __future__ import annotations

import argparse
from datetime import datetime

from serentak.cli.output import EXIT_OK, Output, message_dict
from serentak.cli.parser import notify_address, notify_tls_server_name
from serentak.notify.v1 import notify_pb2
from serentak.sdk import SerentakClient, notifications_in

# Subscribe batches what is already waiting (no added latency); at most 64.
_MAX_BATCH = 64


class WatchRun:
    """What Ctrl-C needs to say how to resume: the last cursor seen."""

    cursor: str = ""


def address(args: argparse.Namespace) -> str:
    """The notify service `watch` subscribes to."""
    return str(args.notify_address or notify_address())


def tls_server_name(args: argparse.Namespace) -> str:
    """The TLS name `watch` verifies the notify service by ("": its address)."""
    return str(args.notify_tls_server_name or notify_tls_server_name())


def _line(n: notify_pb2.Notification) -> str:
    when = n.created_at.ToDatetime().astimezone() if n.created_at.seconds else datetime.now()
    times = f" (x{n.digest_count})" if n.digest_count > 1 else ""
    return (
        f"{when:%Y-%m-%d %H:%M:%S}  {n.summary or n.event_type}{times}  "
        f"[{n.event_type} file {n.file_id} v{n.version}]"
    )


async def watch(args: argparse.Namespace, client: SerentakClient, out: Output) -> int:
    """Print notifications after --cursor (default: from now on) until Ctrl-C."""
    WatchRun.cursor = args.cursor
    if args.cursor:
        out.note(f"watching from cursor {args.cursor} (Ctrl-C stops)")
    opened = bool(args.cursor)
    async for message in client.subscribe(args.cursor, max_batch=_MAX_BATCH):
        if not opened:  # the "now" marker: live from here
            out.note("watching (Ctrl-C stops)")
            opened = True
        for n in notifications_in(message):
            if out.json_mode:
                out.stream(message_dict(n))
            else:
                out.line(_line(n))
        WatchRun.cursor = message.cursor or WatchRun.cursor
    return EXIT_OK
