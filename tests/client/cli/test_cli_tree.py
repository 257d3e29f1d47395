"""`serentak mkdir | mv | rm | restore` against the running services: ids, --json
documents, exit codes."""

from __future__ import annotations

from pathlib import Path

from upload.cli_helpers import one_line_error, serentak


async def test_mkdir_mv_rm_restore(stack, tmp_path: Path) -> None:
    at = ["--address", stack.upload]
    source = tmp_path / "notes.txt"
    source.write_bytes(b"notes")
    file_id = (await serentak(*at, "--json", "upload", str(source))).json()["upload"]["file_id"]

    made = await serentak(*at, "mkdir", "docs", "--json")
    assert made.code == 0, made.err
    docs = made.json()["file"]
    assert (docs["name"], docs["kind"]) == ("docs", "folder")
    sub = await serentak(*at, "mkdir", "2026", "--parent", docs["file_id"])
    assert sub.code == 0 and sub.out.split() == [sub.out.split()[0], "2026"]
    taken = await serentak(*at, "mkdir", "docs")
    assert taken.code == 5 and "NAME_TAKEN" in one_line_error(taken)

    moved = await serentak(*at, "mv", file_id, docs["file_id"], "--name", "minutes.txt", "--json")
    assert moved.code == 0, moved.err
    assert moved.json()["file"]["parent_id"] == docs["file_id"]
    assert moved.json()["file"]["name"] == "minutes.txt"
    inside = (await serentak(*at, "ls", docs["file_id"], "--json")).json()["files"]
    assert sorted((f["name"], f["kind"]) for f in inside) == [
        ("2026", "folder"),
        ("minutes.txt", "file"),
    ]
    nothing = await serentak(*at, "mv", file_id)
    assert nothing.code == 2 and "FOLDER_ID" in one_line_error(nothing)
    cycle = await serentak(*at, "mv", docs["file_id"], sub.out.split()[0])
    assert cycle.code == 2 and "MOVE_CYCLE" in one_line_error(cycle)

    removed = await serentak(*at, "rm", file_id)
    assert removed.code == 0 and f"serentak restore {file_id}" in removed.out
    assert [
        f["name"] for f in (await serentak(*at, "ls", docs["file_id"], "--json")).json()["files"]
    ] == ["2026"]
    missing = await serentak(*at, "rm", "nosuchfile", "--json")
    assert missing.code == 3 and missing.json()["error"]["exit_code"] == 3
    back = await serentak(*at, "restore", file_id)
    assert back.code == 0 and "restored minutes.txt" in back.out
    as_bob = await serentak(*at, "--token", "dev-bob", "rm", file_id)
    assert as_bob.code in (3, 4) and "Traceback" not in as_bob.err
