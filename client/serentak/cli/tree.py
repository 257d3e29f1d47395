"""`serentak mkdir | mv | rm | restore`: the file tree, on the SDK's FileService calls.

`restore FILE_ID VERSION` (a version number) is the version history's (`versions.py`).
"""

from __future__ import annotations

import argparse

from serentak.cli import versions
from serentak.cli.commands import file_dict
from serentak.cli.output import EXIT_OK, EXIT_USAGE, CliError, Output
from serentak.sdk import SerentakClient


async def mkdir(args: argparse.Namespace, client: SerentakClient, out: Output) -> int:
    """Create a folder in --parent (default: your root); prints its id."""
    folder = await client.create_folder(args.name, parent_id=args.parent)
    out.document = {"file": file_dict(folder)}
    out.line(f"{folder.file_id} {folder.name}")
    return EXIT_OK


async def mv(args: argparse.Namespace, client: SerentakClient, out: Output) -> int:
    """Move a file or folder into FOLDER_ID and/or rename it (--name)."""
    if not args.folder_id and not args.name:
        raise CliError("give the FOLDER_ID to move into, or --name to rename", EXIT_USAGE)
    moved = None
    if args.folder_id:
        moved = await client.move(args.file_id, args.folder_id)
    if args.name:
        # A second change: a move that succeeded stays if the name is then refused.
        moved = await client.rename(args.file_id, args.name)
    assert moved is not None
    out.document = {"file": file_dict(moved)}
    out.line(f"{moved.file_id} {moved.name} in folder {moved.parent_id} (v{moved.version})")
    return EXIT_OK


async def rm(args: argparse.Namespace, client: SerentakClient, out: Output) -> int:
    """Soft-delete each FILE_ID in turn (stops at the first refusal)."""
    deleted = []
    try:
        for file_id in args.file_ids:
            f = await client.delete(file_id)
            deleted.append(file_dict(f))
            out.line(f"deleted {f.name} ({f.file_id}); undo: serentak restore {f.file_id}")
    finally:
        out.document = {"deleted": deleted}
    return EXIT_OK


async def restore(args: argparse.Namespace, client: SerentakClient, out: Output) -> int:
    """Undo `rm` for one file or folder; with a VERSION, restore that content instead."""
    if args.version is not None:
        return await versions.restore_version(args, client, out)
    f = await client.restore(args.file_id)
    out.document = {"file": file_dict(f)}
    out.line(f"restored {f.name} ({f.file_id})")
    return EXIT_OK
