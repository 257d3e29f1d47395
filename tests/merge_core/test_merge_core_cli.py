"""`python -m merge_core`: JSON output and exit codes (0 ok, 2 bad input,
3 corrupt data, 4 I/O error); no progress bar when stderr is not a TTY."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from merge_core.cli import EXIT_BAD_INPUT, EXIT_CORRUPT, EXIT_IO, EXIT_OK, main


def write_manifest(tmp_path: Path, chunks: list[dict[str, Any]] | dict[str, Any]) -> Path:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(chunks))
    return path


def make_parts(tmp_path: Path, sizes: list[int]) -> tuple[list[dict[str, Any]], bytes]:
    """Chunk files in tmp_path/parts, with manifest entries relative to tmp_path."""
    (tmp_path / "parts").mkdir()
    entries, whole = [], b""
    for index, size in enumerate(sizes):
        data = os.urandom(size)
        (tmp_path / "parts" / f"{index}.part").write_bytes(data)
        entries.append(
            {
                "index": index,
                "path": f"parts/{index}.part",
                "size": size,
                "checksum": hashlib.sha256(data).hexdigest(),
            }
        )
        whole += data
    return entries, whole


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    try:
        code = main(list(args))
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_success_prints_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entries, whole = make_parts(tmp_path, [1000, 0, 5000])
    manifest = write_manifest(tmp_path, entries[::-1])
    output = tmp_path / "out.bin"
    code, result = run_cli(capsys, str(manifest), str(output))
    assert code == EXIT_OK
    assert output.read_bytes() == whole
    assert result["checksum"] == hashlib.sha256(whole).hexdigest()
    assert result["size"] == len(whole) and result["chunk_count"] == 3


@pytest.mark.parametrize("flag", ["--mmap", "--no-mmap"])  # --no-mmap: the default, kept
def test_mmap_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str) -> None:
    entries, whole = make_parts(tmp_path, [1000, 70_000])
    manifest = write_manifest(tmp_path, entries)
    output = tmp_path / "out.bin"
    code, result = run_cli(capsys, str(manifest), str(output), flag, "--no-fsync")
    assert code == EXIT_OK
    assert output.read_bytes() == whole
    assert result["checksum"] == hashlib.sha256(whole).hexdigest()


def test_manifest_object_with_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entries, whole = make_parts(tmp_path, [10, 20])
    manifest = write_manifest(
        tmp_path, {"chunks": entries, "expected_checksum": hashlib.sha256(whole).hexdigest()}
    )
    assert run_cli(capsys, str(manifest), str(tmp_path / "o"), "--no-fsync")[0] == EXIT_OK
    bad = write_manifest(tmp_path, {"chunks": entries, "expected_checksum": "0" * 64})
    code, report = run_cli(capsys, str(bad), str(tmp_path / "o2"))
    assert (code, report["error"]) == (EXIT_CORRUPT, "FileChecksumMismatch")


@pytest.mark.parametrize(
    "manifest_text",
    [
        "not json",
        "{}",
        "[1]",
        '[{"index": 0, "path": "p", "size": -1, "checksum": "ab"}]',
        '[{"index": true, "path": "p", "size": 1, "checksum": "ab"}]',
    ],
)
def test_invalid_manifest_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], manifest_text: str
) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(manifest_text)
    code, report = run_cli(capsys, str(manifest), str(tmp_path / "out.bin"))
    assert (code, report["error"]) == (EXIT_BAD_INPUT, "bad_input")
    assert not (tmp_path / "out.bin").exists()


def test_bad_input_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entries, _ = make_parts(tmp_path, [10, 20, 30])
    out = str(tmp_path / "out.bin")
    code, report = run_cli(capsys, str(tmp_path / "absent.json"), out)
    assert code == EXIT_BAD_INPUT
    code, report = run_cli(capsys, str(write_manifest(tmp_path, [entries[0], entries[2]])), out)
    assert (code, report["error"], report["index"]) == (EXIT_BAD_INPUT, "MissingChunk", 1)
    code, report = run_cli(capsys, str(write_manifest(tmp_path, [*entries, entries[1]])), out)
    assert (code, report["error"], report["index"]) == (EXIT_BAD_INPUT, "DuplicateChunk", 1)
    code, report = run_cli(
        capsys, str(write_manifest(tmp_path, entries)), out, "--algorithm", "md5"
    )
    assert (code, report["error"]) == (EXIT_BAD_INPUT, "usage")
    broken = [entries[0], {**entries[1], "checksum": "zz"}, entries[2]]
    code, report = run_cli(capsys, str(write_manifest(tmp_path, broken)), out)
    assert (code, report["error"]) == (EXIT_BAD_INPUT, "bad_input")


def test_corrupt_data_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entries, _ = make_parts(tmp_path, [10, 20, 30])
    out = str(tmp_path / "out.bin")
    wrong_sum = [entries[0], {**entries[1], "checksum": "1" * 64}, entries[2]]
    code, report = run_cli(capsys, str(write_manifest(tmp_path, wrong_sum)), out)
    assert (code, report["error"], report["index"]) == (EXIT_CORRUPT, "ChunkChecksumMismatch", 1)
    assert report["expected"] == "1" * 64 and report["actual"] == entries[1]["checksum"]
    wrong_size = [entries[0], entries[1], {**entries[2], "size": 31}]
    code, report = run_cli(capsys, str(write_manifest(tmp_path, wrong_size)), out)
    assert (code, report["error"], report["index"]) == (EXIT_CORRUPT, "ChunkSizeMismatch", 2)
    assert not Path(out).exists()


def test_io_error_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entries, _ = make_parts(tmp_path, [10, 20])
    os.remove(tmp_path / "parts" / "1.part")
    code, report = run_cli(
        capsys, str(write_manifest(tmp_path, entries)), str(tmp_path / "out.bin")
    )
    assert (code, report["error"], report["index"], report["errno"]) == (
        EXIT_IO,
        "MergeIOError",
        1,
        2,
    )


def test_module_entry_point_without_tty(tmp_path: Path) -> None:
    entries, whole = make_parts(tmp_path, [100_000, 3])
    manifest = write_manifest(tmp_path, entries)
    run = subprocess.run(
        [sys.executable, "-m", "merge_core", str(manifest), str(tmp_path / "out.bin")],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert run.returncode == EXIT_OK
    assert run.stderr == ""  # no progress bar when stderr is not a terminal
    assert json.loads(run.stdout)["size"] == len(whole)
    bad = subprocess.run(
        [sys.executable, "-m", "merge_core", str(manifest)], capture_output=True, text=True
    )
    assert bad.returncode == EXIT_BAD_INPUT and json.loads(bad.stdout)["error"] == "usage"


def test_stdin_manifest(tmp_path: Path) -> None:
    entries, whole = make_parts(tmp_path, [10, 20])
    run = subprocess.run(
        [sys.executable, "-m", "merge_core", "-", "out.bin", "--no-fsync"],
        input=json.dumps(entries),
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert run.returncode == EXIT_OK, run.stdout
    assert (tmp_path / "out.bin").read_bytes() == whole
