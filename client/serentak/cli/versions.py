"""`serentak versions | restore FILE_ID VERSION`: a file's version history, on the SDK.

`restore FILE_ID` alone is the trash's undo (`tree.restore`); with a VERSION it makes that
older content the file's next version (RestoreVersion).
"""

from __future__ import annotations

import argparse
from typing import Any

from serentak.cli.commands import file_dict
from serentak.cli.output import EXIT_OK, Output, binary_size, message_dict
from serentak.sdk import SerentakClient
from serentak.sdk.files import FileVersion


def version_dict(v: FileVersion) -> dict[str, Any]:
    """A version for --json: its fields (int64s as strings, as in every document),
    `current` and `kept` always present."""
    d = message_dict(v)
    d.update(current=v.current, kept=v.kept, checksum_algorithm=str(v.checksum_algorithm))
    return d


async def versions(args: argparse.Namespace, client: SerentakClient, out: Output) -> int:
    """List a file's content versions, newest first (purged: its bytes are gone)."""
    found = await client.versions(args.file_id)
    out.document = {"file_id": args.file_id, "versions": [version_dict(v) for v in found]}
    for v in found:
        when = (
            v.created_at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S") if v.created_at.seconds else "-"
        )
        state = "current" if v.current else ("kept" if v.kept else "purged")
        out.line(
            f"v{v.version:<5} {binary_size(v.size):>10} {when} {v.author_user_id:<12} "
            f"{state:<7} {v.checksum_algorithm}:{v.checksum[:16]}"
        )
    return EXIT_OK


async def restore_version(args: argparse.Namespace, client: SerentakClient, out: Output) -> int:
    """Make kept content VERSION the file's next version (editors and owners)."""
    done = await client.restore_version(args.file_id, args.version)
    out.document = {
        "file": file_dict(done.file),
        "version": version_dict(done.version),
        "restored_from": done.restored_from,
    }
    out.line(
        f"restored {done.file.name} ({done.file.file_id}) to the content of "
        f"v{done.restored_from}: now v{done.file.version}"
    )
    return EXIT_OK
