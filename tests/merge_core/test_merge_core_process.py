"""merge_core in child processes: SIGKILL midway leaves no output; a
multi-GiB merge stays within its memory budget; Ctrl-C on the CLI cleans up.

No sleeps: each test polls an observable condition (the temporary file's
size) in a bounded loop.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import merge_core

TEMP_SUFFIX = ".merge-tmp"
GIB = 1 << 30


def chunk_dicts(files: list[tuple[str, int, str]], total: int) -> list[dict[str, object]]:
    """Enough entries, cycling over a few 4 MiB files, to make `total` bytes."""
    count = total // files[0][1]
    return [
        {
            "index": i,
            "path": files[i % len(files)][0],
            "size": files[i % len(files)][1],
            "checksum": files[i % len(files)][2],
        }
        for i in range(count)
    ]


def wait_for_temp_file(directory: Path, at_least: int, proc: subprocess.Popen[bytes]) -> Path:
    """Polls until the merge's temporary file holds `at_least` bytes."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "merge finished before it could be interrupted"
        for name in os.listdir(directory):
            if name.endswith(TEMP_SUFFIX):
                temp = directory / name
                try:
                    if temp.stat().st_size >= at_least:
                        return temp
                except FileNotFoundError:
                    pass
    raise AssertionError("the temporary file never grew")


def test_sigkill_midway_leaves_no_output(tmp_path: Path, big_chunk_dir) -> None:  # type: ignore[no-untyped-def]
    _, files = big_chunk_dir
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(chunk_dicts(files, 8 * GIB)))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    output = out_dir / "merged.bin"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "merge_core",
            str(manifest),
            str(output),
            "--no-fsync",
            "--no-progress",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        temp = wait_for_temp_file(out_dir, 64 << 20, proc)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not output.exists()
    # A SIGKILL cannot clean up: the temporary file (beside the output, never
    # at output_path) is all that is left.
    assert temp.parent == out_dir and os.listdir(out_dir) == [temp.name]


def test_cli_interrupt_removes_temp_file(tmp_path: Path, big_chunk_dir) -> None:  # type: ignore[no-untyped-def]
    _, files = big_chunk_dir
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(chunk_dicts(files, 8 * GIB)))
    output = tmp_path / "merged.bin"
    proc = subprocess.Popen(
        [sys.executable, "-m", "merge_core", str(manifest), str(output), "--no-fsync"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_temp_file(tmp_path, 64 << 20, proc)
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert json.loads(stdout)["error"] == "interrupted"
    assert sorted(os.listdir(tmp_path)) == ["manifest.json"]


MEMORY_PROBE = """
import json, os, resource, sys
import merge_core
chunks, output = json.load(open(sys.argv[1])), sys.argv[2]
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = merge_core.merge(chunks, output, fsync=False)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
os.remove(output)
print(json.dumps({"baseline_kib": baseline, "peak_kib": peak, "size": result.size}))
"""

MEMORY_BUDGET = 64 << 20  # bytes above the interpreter's baseline


def test_multi_gib_merge_stays_within_memory_budget(tmp_path: Path, big_chunk_dir) -> None:  # type: ignore[no-untyped-def]
    _, files = big_chunk_dir
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(chunk_dicts(files, 2 * GIB)))
    run = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, str(manifest), str(tmp_path / "merged.bin")],
        capture_output=True,
        check=True,
        timeout=120,
    )
    probe = json.loads(run.stdout)
    assert probe["size"] == 2 * GIB
    grown = (probe["peak_kib"] - probe["baseline_kib"]) * 1024
    # The pipeline's buffers are a fixed budget, far below the file size.
    assert merge_core.BUFFER_BUDGET <= 16 << 20
    assert grown < MEMORY_BUDGET, f"peak RSS grew by {grown / 2**20:.1f} MiB merging 2 GiB"
