"""deploy/compose/compose.yaml: valid against the compose spec; the topology the README
promises (3 etcd members with client and peer TLS, two replicas per service after a
migrations step, Prometheus with the alerts, Grafana provisioned); every file it mounts
exists; its Prometheus config passes promtool."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from support.prometheus import ALERTS, require

from services.common.config import CommonSettings
from services.upload.settings import UploadSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO_ROOT / "deploy" / "compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"
SERVICES = ("upload", "locks", "notify")


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def test_validates_against_the_compose_spec() -> None:
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "check-jsonschema"),
            "--builtin-schema",
            "vendor.compose-spec",
            str(COMPOSE),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_three_etcd_members_with_client_and_peer_tls() -> None:
    services = _compose()
    members = [name for name in services if name.startswith("etcd-")]
    assert members == ["etcd-1", "etcd-2", "etcd-3"]
    for name in members:
        args = services[name]["command"]
        assert "--client-cert-auth" in args and "--peer-client-cert-auth" in args
        assert (
            f"--cert-file=/pki/{name}.pem" in args and f"--peer-cert-file=/pki/{name}.pem" in args
        )
        # Client and peer traffic over TLS; only the metrics listener is plain (scraped).
        urls = [
            a
            for a in args
            if ("-urls=" in a and not a.startswith("--listen-metrics-urls="))
            or a.startswith("--initial-cluster=")
        ]
        assert urls and all("http://" not in a for a in urls), urls
    endpoints = services["locks"]["environment"]["SERENTAK_ETCD_ENDPOINTS"].split(",")
    assert endpoints == [f"{m}:2379" for m in members]
    assert services["locks"]["environment"]["SERENTAK_ETCD_CA_FILE"] == "/pki/ca.pem"


def test_two_replicas_of_each_service_after_the_migrations_step() -> None:
    services = _compose()
    migrate = services["migrate"]
    assert migrate["command"] == ["services.migrate", "all"]
    usage = subprocess.run(
        [sys.executable, "-m", "services.migrate", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "{upload,notify,all}" in usage  # the command the image runs accepts `all`
    for name in SERVICES:
        svc = services[name]
        assert svc["command"] == [f"services.{name}"]
        assert (REPO_ROOT / "services" / name / "__main__.py").exists()
        assert svc["deploy"]["replicas"] == 2
        assert svc["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert svc["read_only"] is True
        env = svc["environment"]
        assert env["SERENTAK_AUTH_MODE"] == "jwt"
        assert env["SERENTAK_MIGRATE_ON_START"] == "false"
        assert env["SERENTAK_TLS_CERT_FILE"] == f"/pki/{name}.pem"
        assert env["SERENTAK_TLS_CLIENT_CA_FILE"] == "/pki/ca.pem"  # mutual TLS
        probe = svc["healthcheck"]["test"]
        assert probe[:4] == ["CMD", "python", "-m", "services.common.health_probe"]
        assert probe[-2:] == ["--service", "readiness"]  # dependents wait for ready
    upload = services["upload"]["environment"]
    assert upload["SERENTAK_BLOB_URL"].startswith("s3://")
    assert upload["SERENTAK_S3_ENDPOINT"] == "http://minio:9000"


def test_secrets_come_from_the_env_file_not_the_compose_file() -> None:
    text = COMPOSE.read_text()
    for variable in (
        "POSTGRES_PASSWORD",
        "S3_SECRET_ACCESS_KEY",
        "GRAFANA_ADMIN_PASSWORD",
        "SYNC_CLIENT_STATE",
        "PAGE_TOKEN_SECRET",  # one key shared by every replica
    ):
        assert f"${{{variable}:?" in text, variable
    example = (COMPOSE_DIR / "example.env").read_text()
    assert "POSTGRES_PASSWORD=" in example and "PAGE_TOKEN_SECRET=" in example


def test_every_mounted_file_exists() -> None:
    mounted = 0
    for name, svc in _compose().items():
        for volume in svc.get("volumes", []):
            source = volume["source"] if isinstance(volume, dict) else volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE_DIR / source).exists(), f"{name}: {source}"
                mounted += 1
    assert mounted >= 6
    dashboards = list((REPO_ROOT / "deploy" / "grafana" / "dashboards").glob("*.json"))
    assert len(dashboards) >= 5


def test_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    promtool = require("promtool")
    config = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    config["rule_files"] = [str(ALERTS)]  # where compose mounts it
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert {f"serentak-{name}" for name in SERVICES} <= jobs  # SerentakTargetDown's job=~
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_service_addresses_spread_over_replicas_and_match_certificate_names(pki: Path) -> None:
    services = _compose()
    env = services["upload"]["environment"]
    k8s = yaml.safe_load_all((REPO_ROOT / "deploy" / "k8s" / "base" / "config.yaml").read_text())
    k8s_env = next(d for d in k8s if d["kind"] == "ConfigMap")["data"]
    for name in SERVICES:
        for address in (
            env[f"SERENTAK_{name.upper()}_ADDRESS"],
            k8s_env[f"SERENTAK_{name.upper()}_ADDRESS"],
        ):
            assert address.startswith("dns:///"), address  # every replica, round-robin
            host = address.removeprefix("dns:///").rsplit(":", 1)[0]
            text = subprocess.run(
                [
                    "openssl",
                    "x509",
                    "-in",
                    str(pki / f"{name}.pem"),
                    "-noout",
                    "-ext",
                    "subjectAltName",
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            assert f"DNS:{host}," in text or text.rstrip().endswith(f"DNS:{host}"), (name, host)


def _published(spec: str) -> tuple[list[int], int]:
    """`[IP:]HOST[-HOST_END]:CONTAINER` -> (host ports, container port)."""
    parts = spec.split(":")
    host, container = parts[-2], int(parts[-1].split("/")[0])
    first, _, last = host.partition("-")
    return list(range(int(first), int(last or first) + 1)), container


def test_published_ports_are_unique_one_per_replica_and_clear_of_make_run() -> None:
    services = _compose()
    owner: dict[int, str] = {}
    for name, svc in services.items():
        for spec in svc.get("ports", []):
            hosts, _ = _published(spec)
            for port in hosts:
                assert port not in owner, f"host port {port}: {owner[port]} and {name}"
                owner[port] = name
    defaults = CommonSettings.model_fields
    tus_port = UploadSettings.model_fields["tus_port"].default
    for name in SERVICES:
        # The gRPC port, and for upload the tus endpoint's (HTTPS on the same certificate).
        expected = [defaults[f"{name}_port"].default] + ([tus_port] if name == "upload" else [])
        specs = services[name]["ports"]
        assert [_published(spec)[1] for spec in specs] == expected, name
        for spec in specs:
            hosts, _ = _published(spec)
            assert spec.startswith("127.0.0.1:"), spec  # loopback only, as the other parts
            assert len(hosts) >= services[name]["deploy"]["replicas"], name  # one per replica
    assert services["upload"]["environment"]["SERENTAK_TUS_ENABLED"] == "true"
    # `make run`'s ports (the settings' defaults) stay free for a checkout beside compose.
    make_run = {f.default for key, f in defaults.items() if key.endswith("_port") and f.default}
    make_run.add(tus_port)
    assert not make_run & set(owner), sorted(make_run & set(owner))


# The private keys each container may read: its own (locks: also the etcd client's).
OWN_KEYS = {
    "upload": {"upload-key.pem"},
    "locks": {"locks-key.pem", "etcd-client-key.pem"},
    "notify": {"notify-key.pem"},
    "etcd-1": {"etcd-1-key.pem"},
    "etcd-2": {"etcd-2-key.pem"},
    "etcd-3": {"etcd-3-key.pem"},
}


def _pki_view(svc: dict, pki: Path) -> dict[str, Path]:
    """Container path -> file of gen-pki.sh's output, for every PKI file `svc` can read."""
    seen: dict[str, Path] = {}
    for volume in svc.get("volumes", []):
        if isinstance(volume, str):
            if ":" not in volume:
                continue  # an anonymous volume (scratch)
            source, target = volume.split(":")[:2]
            subpath = ""
        else:
            source, target = volume["source"], volume["target"]
            subpath = volume.get("volume", {}).get("subpath", "")
        if source != "pki":
            continue
        root = pki / subpath
        assert root.is_dir(), f"subpath {subpath}: not made by gen-pki.sh"
        for path in root.rglob("*"):
            if path.is_file():
                seen[f"{target}/{path.relative_to(root)}"] = path
    return seen


def test_every_container_reads_only_its_own_private_keys(pki: Path) -> None:
    services = _compose()
    for name, svc in services.items():
        if name == "pki":
            continue  # the one-shot that makes them
        keys = {Path(p).name for p in _pki_view(svc, pki) if p.endswith("-key.pem")}
        assert keys == OWN_KEYS.get(name, set()), f"{name} reads {sorted(keys)}"
    assert {"upload", "locks", "notify", "etcd-1", "migrate", "jwks"} <= set(services)


def test_every_pki_file_a_container_names_is_in_its_mount(pki: Path) -> None:
    named = 0
    for name, svc in _compose().items():
        if name == "pki":
            continue
        view = _pki_view(svc, pki)
        env = svc.get("environment", {})
        words = [str(v) for v in env.values()] + [str(a) for a in svc.get("command", [])]
        words += [str(a) for a in svc.get("healthcheck", {}).get("test", [])]
        for word in words:
            path = word.split("=", 1)[-1]
            if path.startswith("/pki/") and path.endswith((".pem", ".jwt")):
                assert path in view, f"{name}: {path} is not mounted"
                named += 1
        if name == "jwks":
            assert "/pki/public/jwks.json" in view
    assert named >= 30
