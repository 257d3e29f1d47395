"""`serentak download ID DEST`: a DEST ending in `/` (or an existing directory) is a
directory to download into; a missing one is exit 2 and nothing is written (as `cp` and
curl without --create-dirs), never a file named after the directory."""

from __future__ import annotations

import asyncio
from pathlib import Path

from upload.cli_helpers import one_line_error, serentak


async def test_a_directory_destination(stack, tmp_path: Path) -> None:
    source = tmp_path / "src" / "report.bin"
    source.parent.mkdir()
    source.write_bytes(b"report bytes")
    async with stack.client("dev-alice") as alice:
        file_id = (await alice.upload(source)).file_id
    work = tmp_path / "work"
    (work / "into").mkdir(parents=True)
    (work / "plain.txt").write_bytes(b"x")
    at = ["--address", stack.upload]

    missing, not_dir, into, into_slash, named = await asyncio.gather(
        serentak(*at, "download", file_id, f"{work / 'missing_dir'}/"),
        serentak(*at, "download", file_id, f"{work / 'plain.txt'}/", "--json"),
        serentak(*at, "download", file_id, str(work / "into")),
        serentak(*at, "download", file_id, f"{work / 'into'}/", "--json"),
        serentak(*at, "download", file_id, str(work / "copy.bin")),
    )
    assert missing.code == 2 and "missing_dir/: no such directory" in one_line_error(missing)
    assert "mkdir -p" in missing.err
    assert not (work / "missing_dir").exists()
    assert not_dir.code == 2 and "not a directory" in not_dir.json()["error"]["message"]
    assert (work / "plain.txt").read_bytes() == b"x"
    assert into.code == 0 and into_slash.code == 0, (into.err, into_slash.err)
    assert into_slash.json()["path"] == str(work / "into" / "report.bin")
    assert (work / "into" / "report.bin").read_bytes() == b"report bytes"
    assert named.code == 0 and (work / "copy.bin").read_bytes() == b"report bytes"
    assert sorted(p.name for p in work.iterdir()) == ["copy.bin", "into", "plain.txt"]
