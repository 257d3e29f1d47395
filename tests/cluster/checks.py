"""What the cluster test asserts once the workload is done: the database against the
store (nothing lost, nothing twice, nothing orphaned), and the services' own logs."""

from __future__ import annotations

from collections import Counter

from cluster.workload import World, sha
from sqlalchemy import create_engine, text
from support.process import ASYNCIO_WARNINGS
from support.s3 import S3Server

from services.common.db import sync_url


def activity(url: str) -> str:
    """Open transactions and lock waits in the database at `url` (for failure messages)."""
    engine = create_engine(sync_url(url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT pid, state, wait_event_type, wait_event, now() - xact_start, "
                    "left(query, 200) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND state <> 'idle' "
                    "AND pid <> pg_backend_pid()"
                )
            ).all()
    finally:
        engine.dispose()
    return "; ".join(str(tuple(r)) for r in rows) or "no open transactions"


def check_database_and_store(world: World, upload_db: str, s3: S3Server, prefix: str) -> None:
    """Exactly one content event per upload; every stored object accounted for and right;
    no multipart upload left open on the store or recorded as open."""
    engine = create_engine(sync_url(upload_db))
    try:
        with engine.connect() as conn:
            statuses = dict(conn.execute(text("SELECT id, status FROM uploads")).all())
            events = Counter(
                (aggregate_id, version)
                for aggregate_id, version in conn.execute(
                    text(
                        "SELECT aggregate_id, version FROM outbox_events "
                        "WHERE event_type = 'file.content.updated'"
                    )
                ).all()
            )
            chunks = {
                (u, i)
                for u, i in conn.execute(text("SELECT upload_id, chunk_index FROM upload_chunks"))
            }
            open_multipart = conn.execute(
                text("SELECT object_key, upload_id FROM s3_multipart_uploads")
            ).all()
    finally:
        engine.dispose()
    assert set(statuses) == set(world.uploads)
    assert set(statuses.values()) == {"completed"}
    for upload_id, file_id in world.upload_file.items():
        assert events[(file_id, world.versions[upload_id])] == 1, upload_id
    assert sum(events.values()) == len(world.uploads), "a merge committed twice"
    keys = s3.keys(f"{prefix}/")
    unexplained = []
    for key in (k.removeprefix(f"{prefix}/") for k in keys):
        parts = key.split("/")
        if parts[0] == "uploads" and len(parts) == 3 and (parts[1], int(parts[2])) in chunks:
            continue
        if parts[0] == "files" and len(parts) == 3 and world.upload_file.get(parts[2]) == parts[1]:
            stored = s3.object_path(f"{prefix}/{key}").read_bytes()
            assert sha(stored) == sha(world.uploads[parts[2]]), key
            continue
        unexplained.append(key)
    assert not unexplained, f"orphan or partial objects: {unexplained[:20]}"
    stored_files = {k.split("/")[-1] for k in keys if k.startswith(f"{prefix}/files/")}
    assert stored_files == set(world.uploads), "a completed upload's object is missing"
    assert s3.multipart_state() == [], "a multipart upload left open on the store"
    assert open_multipart == [], f"multipart uploads recorded as open: {open_multipart}"


def log_problems(logs: dict[str, str]) -> list[str]:
    """What must never be in a service's log: an INTERNAL answer, a bug, a refused token,
    an asyncio warning (a task or coroutine dropped)."""
    found = []
    for name, log in logs.items():
        for needle, what in (
            ('"code": "INTERNAL"', "answered INTERNAL"),
            ('"rpc_bug"', "hit a bug"),
            ('"code": "UNAUTHENTICATED"', "refused a token"),
            *((warning, f"asyncio: {warning}") for warning in ASYNCIO_WARNINGS),
        ):
            if needle in log:
                at = log.find(needle)
                found.append(f"{name} {what}: {log[max(0, at - 600) : at + 400]}")
    return found
