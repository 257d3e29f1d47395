"""docs/deploy-replicated.md's settings without starting anything: its inventory and the
steps that make the secrets, the PKI, the settings files and the scrape config, run as the
guide says; every rendered file complete (envsubst turns an unknown `${NAME}` into nothing,
silently), every file it names present, each service's settings loading from its file, and
Prometheus accepting the scrape config. The deployment itself: tests/cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from support.guide import Guide, blocks
from support.prometheus import require
from support.services import REPO_ROOT

from services.common.config import CommonSettings
from services.locks.settings import LocksSettings
from services.notify.settings import NotifySettings
from services.upload.settings import UploadSettings
from services.upload.sync.settings import SyncSettings

GUIDE = REPO_ROOT / "docs" / "deploy-replicated.md"
# Steps that only write files: secrets (1), PKI (3), settings (4), the scrape config (11).
OFFLINE_SECTIONS = ("1.", "3.", "4.", "11.")
SETTINGS = {"upload": UploadSettings, "locks": LocksSettings, "notify": NotifySettings}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Guide:
    """The guide's files, rendered for its default inventory, plus S3 keys and the CA
    files it leaves blank (an identity provider and a store whose certificates a private CA
    signed: the guide's own CA stands in for theirs)."""
    for tool in ("openssl", "envsubst"):
        if shutil.which(tool) is None:
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"{tool} is required in CI (.ci/run installs it)")
            pytest.skip(f"{tool} not installed")
    folder = tmp_path_factory.mktemp("replicated")
    guide = Guide(GUIDE, folder)
    ca = str(folder / "srv" / "pki" / "ca.pem")  # made by the PKI step
    values = {
        "DIR": str(folder / "srv"),
        "S3_ACCESS_KEY_ID": "k",
        "S3_SECRET_ACCESS_KEY": "s",
        "S3_CA_FILE": ca,
        "JWKS_URL": "https://idp.serentak.internal/jwks.json",
        "JWKS_CA_FILE": ca,
    }
    for block in blocks(GUIDE):
        if block.kind == "inventory":
            guide.inventory(block, values)
        elif block.kind == "step" and block.section.startswith(OFFLINE_SECTIONS):
            guide.step(block)
    return guide


def test_the_guide_marks_its_blocks_in_a_followable_order() -> None:
    found = blocks(GUIDE)
    kinds = [b.kind for b in found]
    assert kinds[0] == "inventory" and kinds.count("inventory") == 1
    runs = [b.name for b in found if b.kind == "run"]
    assert runs == ["etcd", "jwks", "locks", "notify", "upload"]
    # Every process the guide starts is followed by a check that it is up.
    for i, block in enumerate(found):
        if block.kind == "run":
            assert "check" in kinds[i + 1 :], block.label


@pytest.mark.parametrize("service", sorted(SETTINGS))
def test_each_replica_settings_file_loads_complete(
    rendered: Guide, service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = set()
    for n in (1, 2):
        env = rendered.read_env_file(f"etc/{service}-{n}.env")
        assert [k for k, v in env.items() if not v] == [], f"{service}-{n}: empty settings"
        missing = [v for k, v in env.items() if k.endswith("_FILE") and not Path(v).exists()]
        assert missing == [], missing
        for name in [n for n in os.environ if n.startswith("SERENTAK_")]:
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        settings = SETTINGS[service]()
        assert isinstance(settings, CommonSettings)
        assert settings.auth_mode == "jwt" and not settings.migrate_on_start
        assert settings.tls_cert_file == Path(env["SERENTAK_TLS_CERT_FILE"])
        assert settings.tls_cert_file.name == f"{service}-{n}.pem"
        ports.add(settings.health_port)
        assert settings.auth_jwks_ca_file == Path(rendered.env["JWKS_CA_FILE"])
        if service == "upload":
            assert isinstance(settings, UploadSettings)
            assert settings.s3_ca_file == Path(rendered.env["S3_CA_FILE"])
            assert SyncSettings().client_state == env["SERENTAK_SYNC_CLIENT_STATE"]
            assert len(env["SERENTAK_LOCKS_ADDRESS"].split(",")) == 2
    assert len(ports) == 1  # the same port on every host


def test_every_etcd_member_config_is_complete(rendered: Guide) -> None:
    etc = Path(rendered.env["DIR"]) / "etc"
    for n in (1, 2, 3):
        config = yaml.safe_load((etc / f"etcd-{n}.yml").read_text())
        assert config["name"] == f"etcd-{n}"
        assert len(config["initial-cluster"].split(",")) == 3
        for part in ("client-transport-security", "peer-transport-security"):
            tls = config[part]
            assert tls["client-cert-auth"] is True
            assert all(Path(tls[k]).exists() for k in ("cert-file", "key-file", "trusted-ca-file"))
        host = config["listen-client-urls"].split("//")[1].split(":")[0]
        san = subprocess.run(
            ["openssl", "x509", "-in", tls["cert-file"], "-noout", "-ext", "subjectAltName"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"IP Address:{host}" in san  # peers and clients dial the member's own IP


def test_prometheus_accepts_the_scrape_config(rendered: Guide) -> None:
    promtool = require("promtool")
    path = Path(rendered.env["DIR"]) / "etc" / "prometheus-serentak.yml"
    jobs = {j["job_name"]: j for j in yaml.safe_load(path.read_text())["scrape_configs"]}
    assert set(jobs) == {"serentak-upload", "serentak-locks", "serentak-notify", "etcd"}
    assert jobs["etcd"]["static_configs"][0]["targets"] == [f"10.0.1.{n}:2381" for n in (1, 2, 3)]
    done = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
