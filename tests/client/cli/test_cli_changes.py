"""`serentak changes`: the snapshot then the changes, a --json document with the cursor,
resuming from it, and --follow printing changes as they commit until Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import re
import signal

from upload.cli_helpers import cli_env, serentak, start

DEADLINE_S = 60.0


async def test_changes_snapshot_resume_and_follow(stack) -> None:
    at = ["--address", stack.upload]
    async with stack.client("dev-alice") as alice:
        docs = await alice.create_folder("docs")
        first = await serentak(*at, "changes", "--json")
        assert first.code == 0, first.err
        doc = first.json()
        by_id = {c["file_id"]: c for c in doc["changes"]}
        assert by_id[docs.file_id]["kind"] == "listed"
        assert by_id[docs.file_id]["file"]["name"] == "docs" and doc["cursor"]

        await alice.rename(docs.file_id, "papers")
        again = await serentak(*at, "changes", "--cursor", doc["cursor"])
        assert again.code == 0, again.err
        assert again.out.split() == ["renamed", docs.file_id, "v2", "papers"]
        assert re.search(r"cursor: \S+", again.err)
        forged = await serentak(*at, "changes", "--cursor", "not-a-cursor")
        assert forged.code != 0 and "CURSOR_INVALID" in forged.err

        proc = await start(
            *at, "changes", "--follow", "--json", "--cursor", doc["cursor"], env=cli_env()
        )
        assert proc.stdout is not None and proc.stderr is not None
        renamed = json.loads(await asyncio.wait_for(proc.stdout.readline(), DEADLINE_S))
        assert renamed["kind"] == "renamed" and renamed["cursor"]
        note = (await asyncio.wait_for(proc.stderr.readline(), DEADLINE_S)).decode()
        assert note.startswith("following"), note
        await alice.delete(docs.file_id)
        deleted = json.loads(await asyncio.wait_for(proc.stdout.readline(), DEADLINE_S))
        assert (deleted["kind"], deleted["file_id"], deleted["removed"]) == (
            "deleted",
            docs.file_id,
            True,
        )
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), DEADLINE_S)
        assert proc.returncode == 0 and "Traceback" not in err.decode(), err
        assert f"--cursor {deleted['cursor']}" in err.decode()
