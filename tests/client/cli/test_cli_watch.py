"""`serentak watch`: notifications as they happen, one line (or one JSON object) each;
Ctrl-C ends it with 0 and the cursor to resume from, and resuming misses nothing."""

from __future__ import annotations

import asyncio
import json
import re
import signal

from upload.cli_helpers import cli_env, start

DEADLINE_S = 60.0


async def _watching(*argv: str) -> asyncio.subprocess.Process:
    """Start `serentak watch ARGV` as bob; return once it reports the stream open."""
    proc = await start("watch", "--token", "dev-bob", *argv, env=cli_env())
    assert proc.stderr is not None
    line = (await asyncio.wait_for(proc.stderr.readline(), DEADLINE_S)).decode()
    assert line.startswith("watching"), line
    return proc


async def _stop(proc: asyncio.subprocess.Process) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), DEADLINE_S)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


async def test_watch_prints_live_notifications_and_resumes_from_its_cursor(stack) -> None:
    at = ["--notify-address", stack.notify]
    async with stack.client("dev-alice") as alice:
        live = await _watching(*at)
        docs = await alice.create_folder("docs")
        await alice.share(docs.file_id, "bob", "editor")
        assert live.stdout is not None
        line = (await asyncio.wait_for(live.stdout.readline(), DEADLINE_S)).decode()
        assert "file.shared" in line and docs.file_id in line and "alice" in line
        code, err = await _stop(live)
        assert code == 0 and "Traceback" not in err, err
        resume = re.search(r"resume with: serentak watch --cursor (\S+)", err)
        assert resume, err

        # While nobody watches: a rename bob hears of once he resumes from the cursor.
        await alice.rename(docs.file_id, "papers")
        replay = await _watching(*at, "--cursor", resume.group(1), "--json")
        assert replay.stdout is not None
        first = json.loads(await asyncio.wait_for(replay.stdout.readline(), DEADLINE_S))
        assert first["file_id"] == docs.file_id and first["event_type"] == "file.renamed"
        assert first["user_id"] == "bob" and first["cursor"] != resume.group(1)
        code, err = await _stop(replay)
        assert code == 0 and f"--cursor {first['cursor']}" in err
