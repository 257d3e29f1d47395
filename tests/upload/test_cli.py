"""The `serentak` CLI as a subprocess against a running upload service: exit codes,
`--json` documents, progress and errors on stderr, every command path."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from upload.cli_helpers import Run, cli_env, one_line_error, serentak, start

from services.upload.storage.blob_store import content_key


@pytest.fixture
def database_url(tmp_path) -> str:
    """SQLite only: the CLI is a client; the server paths it uses are tested on both DBs."""
    return f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"


def _as(cluster, token: str = "dev-alice") -> list[str]:
    return ["--address", cluster.address, "--token", token]


async def test_upload_ls_status_download_with_json(cluster, tmp_path) -> None:
    source = tmp_path / "movie.bin"
    data = os.urandom(5 * 1024 + 17)
    source.write_bytes(data)
    # Global flags after the subcommand work as well as before it.
    up = await serentak("upload", str(source), "--chunk-size", "1KiB", "--json", *_as(cluster))
    assert up.code == 0, up.err
    doc = up.json()["upload"]
    assert doc["status"] == "completed" and doc["total_chunks"] == 6
    upload_id, file_id = doc["upload_id"], doc["file_id"]
    assert f"upload {upload_id}" in up.err  # printed when created, on stderr
    assert "100.0%" in up.err and "KiB" in up.err and "ETA" in up.err
    # Re-running finds the same upload (same file, layout and target).
    again = await serentak(*_as(cluster), "--json", "upload", str(source), "--chunk-size", "1KiB")
    assert again.json()["upload"]["upload_id"] == upload_id

    status = await serentak(*_as(cluster), "status", upload_id)
    assert status.code == 0 and " completed " in status.out and "UPLOAD_STATUS" not in status.out
    listing = await serentak(*_as(cluster), "ls", "--json")
    assert [f["name"] for f in listing.json()["files"]] == ["movie.bin"]

    target = tmp_path / "back.bin"
    down = await serentak(*_as(cluster), "download", file_id, str(target), "--json")
    assert down.code == 0, down.err
    assert down.json()["verified"] is True and target.read_bytes() == data
    assert "100.0%" in down.err
    into_dir = await serentak(*_as(cluster), "download", file_id, str(tmp_path))
    assert into_dir.code == 0 and (tmp_path / "movie.bin").read_bytes() == data


async def test_download_failures_leave_nothing(cluster, tmp_path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    missing = await serentak(*_as(cluster), "download", "nosuchfile", str(out_dir / "x.bin"))
    assert missing.code == 3 and "NOT_FOUND" in one_line_error(missing)
    assert list(out_dir.iterdir()) == []
    no_dir = await serentak(*_as(cluster), "download", "whatever", str(tmp_path / "no" / "x"))
    assert no_dir.code == 2 and "no such directory" in one_line_error(no_dir)
    as_json = await serentak(*_as(cluster), "--json", "download", "nosuchfile", str(out_dir / "y"))
    error = as_json.json()["error"]
    assert error["exit_code"] == 3 and error["reason"] and list(out_dir.iterdir()) == []


async def test_corrupted_download_is_exit_7_and_leaves_nothing(cluster, tmp_path) -> None:
    source = tmp_path / "data.bin"
    source.write_bytes(os.urandom(3000))
    doc = (await serentak(*_as(cluster), "--json", "upload", str(source))).json()["upload"]
    key = content_key(doc["file_id"], doc["upload_id"])
    raw = await cluster.blobs.read(key)
    await cluster.blobs.publish(await cluster.blobs.stage(key, bytes([raw[0] ^ 1]) + raw[1:]), key)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    bad = await serentak(*_as(cluster), "--json", "download", doc["file_id"], str(out_dir))
    assert bad.code == 7 and "checksum mismatch" in one_line_error(bad)
    assert bad.json()["error"]["reason"] == "CHECKSUM_MISMATCH"
    assert list(out_dir.iterdir()) == []


async def test_usage_errors_are_one_line(cluster, tmp_path) -> None:
    (tmp_path / "f.bin").write_bytes(b"x")
    f = str(tmp_path / "f.bin")
    # Independent runs: concurrently, so the suite pays one interpreter start-up, not eight.
    version, nope, zero, unit, help_run, anonymous, down = await asyncio.gather(
        serentak("--version"),
        serentak(*_as(cluster), "upload", str(tmp_path / "nope.bin")),
        serentak(*_as(cluster), "upload", f, "--chunk-size", "0"),
        serentak(*_as(cluster), "upload", f, "--chunk-size", "8XB", "--json"),
        serentak("--help"),
        serentak("--address", cluster.address, "--token", "forged", "ls"),
        serentak("--address", "127.0.0.1:1", "ls", "--json"),
    )
    assert version.code == 0 and version.out.startswith("serentak ")
    assert nope.code == 2 and "no such file" in one_line_error(nope)
    for bad in (zero, unit):
        assert bad.code == 2 and "Traceback" not in bad.err and "--chunk-size" in bad.err
        assert "_size" not in bad.err
    assert unit.json()["error"]["exit_code"] == 2 and "8XB" in unit.json()["error"]["message"]
    assert "exit codes" in help_run.out and "3 not found" in help_run.out
    assert anonymous.code == 4 and "UNAUTHENTICATED" in one_line_error(anonymous)
    assert down.code == 6 and down.json()["error"]["exit_code"] == 6
    assert "--ca" in down.err


async def test_name_taken_and_new_version_with_to(cluster, tmp_path) -> None:
    first = tmp_path / "a" / "notes.txt"
    first.parent.mkdir()
    first.write_bytes(b"version one")
    up = await serentak(*_as(cluster), "--json", "upload", str(first))
    file_id = up.json()["upload"]["file_id"]
    second = tmp_path / "notes.txt"
    second.write_bytes(b"version two!")
    clash = await serentak(*_as(cluster), "upload", str(second))
    assert clash.code == 5 and "NAME_TAKEN" in one_line_error(clash)
    assert f"--to {file_id}" in clash.err
    new = await serentak(*_as(cluster), "--json", "upload", str(second), "--to", file_id)
    assert new.code == 0, new.err
    doc = new.json()["upload"]
    assert (doc["file_id"], doc["file_version"]) == (file_id, "2")
    # The same bytes into another folder are another upload, not the earlier one's result.
    made = await serentak(*_as(cluster), "--json", "ls")
    assert [f["name"] for f in made.json()["files"]] == ["notes.txt"]


async def test_interrupt_uploads_resume_and_abort(cluster, tmp_path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(400 * 1024))  # 400 chunks: far from done at the signal
    proc = await start(
        *_as(cluster), "upload", str(big), "--chunk-size", "1KiB", "--parallel", "1", env=cli_env()
    )
    assert proc.stderr is not None
    line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
    assert line.startswith("upload ")
    upload_id = line.split()[1]
    proc.send_signal(signal.SIGINT)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    run = Run(proc.returncode or 0, out.decode(), err.decode())
    assert run.code == 130, run.err
    assert "Traceback" not in run.err
    assert f"--resume {upload_id}" in run.err

    listed = await serentak(*_as(cluster), "uploads", "--json")
    assert [u["upload_id"] for u in listed.json()["uploads"]] == [upload_id]
    assert listed.json()["uploads"][0]["status"] == "uploading"
    resumed = await serentak(
        *_as(cluster), "--json", "upload", str(big), "--resume", upload_id, "--parallel", "4"
    )
    assert resumed.code == 0, resumed.err
    assert resumed.json()["upload"]["upload_id"] == upload_id
    assert (await serentak(*_as(cluster), "uploads", "--json")).json()["uploads"] == []

    small = tmp_path / "small.bin"
    small.write_bytes(os.urandom(4096))
    proc = await start(*_as(cluster), "upload", str(small), "--chunk-size", "1KiB")
    assert proc.stderr is not None
    other_id = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode().split()[1]
    proc.send_signal(signal.SIGINT)
    await proc.communicate()
    if proc.returncode == 130:  # interrupted before the last chunk: abort it
        aborted = await serentak(*_as(cluster), "abort", other_id, "--json")
        assert aborted.code == 0 and aborted.json()["upload"]["status"] == "aborted"
    again = await serentak(*_as(cluster), "abort", other_id)
    assert again.code == 5 and "Traceback" not in again.err
    unknown = await serentak(*_as(cluster), "abort", "nosuchupload")
    assert unknown.code == 3


async def test_share_shared_collaborators_unshare(cluster, tmp_path) -> None:
    source = tmp_path / "plan.txt"
    source.write_bytes(b"the plan")
    file_id = (await serentak(*_as(cluster), "--json", "upload", str(source))).json()["upload"][
        "file_id"
    ]
    assert (await serentak(*_as(cluster), "share", file_id, "bob", "--role", "editor")).code == 0
    people = await serentak(*_as(cluster), "collaborators", file_id, "--json")
    assert [(c["user_id"], c["role"]) for c in people.json()["collaborators"]] == [
        ("bob", "editor")
    ]
    bob = await serentak(*_as(cluster, "dev-bob"), "shared", "--json")
    assert [(s["file_id"], s["role"], s["shared_by"]) for s in bob.json()["shared"]] == [
        (file_id, "editor", "alice")
    ]
    human = await serentak(*_as(cluster, "dev-bob"), "shared")
    assert "plan.txt" in human.out and "editor" in human.out
    mallory = await serentak(*_as(cluster, "dev-mallory"), "shared", "--json")
    assert mallory.json()["shared"] == []
    denied = await serentak(*_as(cluster, "dev-carol"), "share", file_id, "dave")
    assert denied.code in (3, 4) and "Traceback" not in denied.err
    assert (await serentak(*_as(cluster), "unshare", file_id, "bob")).code == 0
    assert (await serentak(*_as(cluster, "dev-bob"), "shared", "--json")).json()["shared"] == []


async def test_admin_commands_take_the_address_from_settings(cluster) -> None:
    env = cli_env(SERENTAK_UPLOAD_ADDRESS=cluster.address, SERENTAK_AUTH_MODE="dev")
    stats, letters, purge, replay, audit, as_alice = await asyncio.gather(
        serentak("admin", "stats", "--json", env=env),
        serentak("admin", "dead-letters", "--json", env=env),
        serentak("admin", "purge", env=env),
        serentak("admin", "replay", "999999", env=env),
        serentak("admin", "audit", "--json", env=env),
        # A user's token is not an operator's.
        serentak("admin", "stats", "--token", "dev-alice", env=env),
    )
    assert stats.code == 0, stats.err
    assert isinstance(stats.json().get("job_types", []), list)
    assert letters.code == 0 and letters.json().get("dead_letters", []) == []
    assert purge.code == 0 and "purged 0" in purge.out
    assert replay.code == 3 and "NOT_FOUND" in one_line_error(replay)
    assert audit.code == 0 and audit.json()["healthy"] is True
    assert as_alice.code == 4 and "Traceback" not in as_alice.err
