"""`serentak versions | download --version | restore FILE_ID VERSION` against the running
services: the history, an old version downloaded and verified, a restore, and `restore
FILE_ID` alone still the trash's undo. --json documents and exit codes."""

from __future__ import annotations

import hashlib
from pathlib import Path

from upload.cli_helpers import one_line_error, serentak


async def test_versions_download_and_restore(stack, tmp_path: Path) -> None:
    at = ["--address", stack.upload]
    source = tmp_path / "notes.txt"
    source.write_bytes(b"first draft")
    file_id = (await serentak(*at, "--json", "upload", str(source))).json()["upload"]["file_id"]
    source.write_bytes(b"second draft, longer")
    again = await serentak(*at, "upload", str(source), "--to", file_id)
    assert again.code == 0, again.err

    listed = await serentak(*at, "versions", file_id, "--json")
    assert listed.code == 0, listed.err
    assert [
        (v["version"], v["current"], v["kept"], v["author_user_id"])
        for v in listed.json()["versions"]
    ] == [
        ("2", True, True, "alice"),
        ("1", False, True, "alice"),
    ]
    human = await serentak(*at, "versions", file_id)
    assert [line.split()[0] for line in human.out.splitlines()] == ["v2", "v1"]
    assert "current" in human.out.splitlines()[0] and "kept" in human.out.splitlines()[1]

    old = tmp_path / "old.txt"
    got = await serentak(*at, "download", file_id, str(old), "--version", "1", "--json")
    assert got.code == 0, got.err
    assert old.read_bytes() == b"first draft"
    assert got.json()["verified"] and got.json()["version"] == 1
    assert got.json()["checksum"] == hashlib.sha256(b"first draft").hexdigest()
    missing = await serentak(*at, "download", file_id, str(tmp_path / "x"), "--version", "7")
    assert missing.code == 3 and "VERSION_NOT_FOUND" in one_line_error(missing)
    assert "serentak versions" in missing.err

    # A viewer reads the history but may not restore (exit 4); the editor restores v1.
    await serentak(*at, "share", file_id, "bob", "--role", "viewer")
    as_bob = await serentak(*at, "--token", "dev-bob", "restore", file_id, "1")
    assert as_bob.code == 4 and "INSUFFICIENT_ROLE" in one_line_error(as_bob)
    restored = await serentak(*at, "restore", file_id, "1", "--json")
    assert restored.code == 0, restored.err
    doc = restored.json()
    assert (doc["restored_from"], doc["file"]["version"], doc["version"]["current"]) == (
        1,
        "4",
        True,
    )
    current = tmp_path / "now.txt"
    assert (await serentak(*at, "download", file_id, str(current))).code == 0
    assert current.read_bytes() == b"first draft"
    is_current = await serentak(*at, "restore", file_id, "4")
    assert is_current.code == 5 and "VERSION_IS_CURRENT" in one_line_error(is_current)
    bad = await serentak(*at, "restore", file_id, "zero")
    assert bad.code == 2

    # Without a version, restore is still the undo of rm.
    assert (await serentak(*at, "rm", file_id)).code == 0
    back = await serentak(*at, "restore", file_id)
    assert back.code == 0 and "restored notes.txt" in back.out
