"""`serentak changes [--cursor C] [--follow]`: what changed in everything you can see.

Without --cursor the first lines are a snapshot of your whole view (kind `listed`), then
the changes since. Each line is one change: kind, file id, version and name (a removed
item: `-` instead of a version). The cursor to resume from is printed on stderr at the end
(or on Ctrl-C with --follow, which waits for new changes until stopped). `--json`: one
document `{"changes": [...], "cursor": C}`; with --follow one object a line (JSON Lines),
each carrying the cursor to resume after it.
"""

from __future__ import annotations

import argparse
from typing import Any

from serentak.cli.commands import file_dict
from serentak.cli.output import EXIT_OK, Output
from serentak.sdk import Named, SerentakClient
from serentak.upload.v1 import upload_pb2


class ChangesRun:
    """What Ctrl-C needs to say how to resume: the last cursor seen."""

    cursor: str = ""


def change_dict(change: Named[upload_pb2.Change], cursor: str = "") -> dict[str, Any]:
    """A change for --json: kind (a name), file_id, removed, the file unless removed."""
    d: dict[str, Any] = {
        "kind": str(change.kind),
        "file_id": change.file_id,
        "removed": change.removed,
    }
    if not change.removed:
        d["file"] = file_dict(change.file)
    if cursor:
        d["cursor"] = cursor
    return d


def _line(change: Named[upload_pb2.Change]) -> str:
    if change.removed:
        return f"{change.kind:<16} {change.file_id} -"
    return f"{change.kind:<16} {change.file_id} v{change.file.version:<4} {change.file.name}"


async def changes(args: argparse.Namespace, client: SerentakClient, out: Output) -> int:
    """Print the changes after --cursor (default: a snapshot first); --follow keeps waiting."""
    ChangesRun.cursor = args.cursor
    collected: list[dict[str, Any]] = []
    following = False
    async for page in client.changes(args.cursor, follow=args.follow):
        if page.reset:
            out.note("snapshot of your view follows (kind `listed`)")
        for change in page.changes:
            if args.follow and out.json_mode:
                out.stream(change_dict(change, page.next_cursor))
            elif out.json_mode:
                collected.append(change_dict(change))
            else:
                out.line(_line(change))
        ChangesRun.cursor = page.next_cursor
        if args.follow and not page.has_more and not following:
            out.note("following (Ctrl-C stops)")
            following = True
    if not args.follow:
        out.document = {"changes": collected, "cursor": ChangesRun.cursor}
        out.note(f"cursor: {ChangesRun.cursor}")
    return EXIT_OK
