"""A second notify replica for `bench_notify.py --streams-on-replica`: the same service on
the same database, in its own process, holding the Subscribe streams while the first
replica (the bench's process) takes the Ingest calls. Every notification then reaches its
stream as another replica's commit: a NOTIFY, a read, a delivery.

    python notify_replica.py URL AUDIENCE    # prints its port, serves until stdin closes
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from support.services import running_app  # noqa: E402

from services.common.logging import configure_logging  # noqa: E402
from services.notify.app import build_app  # noqa: E402
from services.notify.settings import NotifySettings  # noqa: E402


def replica_settings(url: str, data_dir: Path, users: list[str]) -> NotifySettings:
    """The bench's notify settings: `tok-<user>` tokens for the audience, dev auth, stream
    caps with room for one stream a user."""
    tokens = {f"tok-{u}": {"tenant_id": "acme", "user_id": u} for u in users}
    room = max(10_000, len(users) + 100)
    return NotifySettings(
        notify_database_url=url,
        data_dir=data_dir,
        auth_tokens=tokens,
        migrate_on_start=True,
        auth_mode="dev",
        streams_max=room,
        streams_per_tenant_max=room,
    )


@contextlib.asynccontextmanager
async def replica_process(
    url: str, audience: int, commits: dict[int, float] | None = None
) -> AsyncIterator[int]:
    """A second replica running in a child process; yields its port. `commits`, when
    given, gets the replica's own fan-out commits on exit (version -> perf_counter): a
    fan-out job may run on either replica."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        url,
        str(audience),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = await proc.stdout.readline()
        if not line:
            raise RuntimeError("the second notify replica did not start")
        yield int(line)
    finally:
        proc.stdin.close()
        rest = await proc.stdout.read()
        await proc.wait()
        if commits is not None and rest.strip():
            stamped = json.loads(rest.decode().strip().splitlines()[-1])
            for version, at in stamped.items():
                commits[int(version)] = min(at, commits.get(int(version), at))


async def _serve(url: str, audience: int) -> None:
    from bench_notify import COMMITTED, stamp_commits, users

    stamp_commits()

    with tempfile.TemporaryDirectory() as tmp:
        settings = replica_settings(url, Path(tmp), users(audience))
        async with running_app(build_app(settings)) as service:
            print(service.app.bound_port, flush=True)
            # Until the bench closes stdin.
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    print(json.dumps(COMMITTED), flush=True)


if __name__ == "__main__":
    configure_logging("bench-replica", "console", "WARNING")
    sys.path.insert(0, str(Path(__file__).parent))
    asyncio.run(_serve(sys.argv[1], int(sys.argv[2])))
