"""deploy/compose's Prometheus: a valid config (promtool) that scrapes what Serentak stands
on (etcd, PostgreSQL through postgres-exporter, MinIO) beside the services, and sends its
alerts to an Alertmanager the compose file runs with a config that routes every alert to a
receiver; each scrape target is a compose service listening where the job says."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from support.prometheus import ALERTS, require

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO_ROOT / "deploy" / "compose"


def _config() -> dict:
    return yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())


def _services() -> dict:
    return yaml.safe_load((COMPOSE_DIR / "compose.yaml").read_text())["services"]


def _targets(job: dict) -> list[str]:
    return [t for sc in job.get("static_configs", []) for t in sc["targets"]]


def test_promtool_accepts_the_config_with_alerting_and_the_dependency_jobs(
    tmp_path: Path,
) -> None:
    promtool = require("promtool")
    config = _config()
    config["rule_files"] = [str(ALERTS)]  # where compose mounts it, from the checkout
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert {"etcd", "postgres", "minio", "alertmanager"} <= jobs, jobs
    (alertmanagers,) = config["alerting"]["alertmanagers"]
    assert _targets(alertmanagers) == ["alertmanager:9093"]


def test_every_scrape_target_is_a_compose_service_that_serves_metrics_there() -> None:
    services = _services()
    jobs = {job["job_name"]: job for job in _config()["scrape_configs"]}
    for job in ("etcd", "postgres", "minio", "alertmanager"):
        for target in _targets(jobs[job]):
            host = target.rsplit(":", 1)[0]
            assert host in services, f"{job}: no compose service {host}"
    # etcd: a plain-HTTP metrics listener on the port scraped (the client port wants mTLS).
    for target in _targets(jobs["etcd"]):
        host, port = target.rsplit(":", 1)
        assert f"--listen-metrics-urls=http://0.0.0.0:{port}" in services[host]["command"]
    assert len(_targets(jobs["etcd"])) == 3
    # MinIO: its cluster metrics, which need no token once the compose file says so.
    assert jobs["minio"]["metrics_path"] == "/minio/v2/metrics/cluster"
    assert services["minio"]["environment"]["MINIO_PROMETHEUS_AUTH_TYPE"] == "public"
    # PostgreSQL: the exporter reaches the database compose runs, as its owner.
    exporter = services["postgres-exporter"]
    assert exporter["image"].startswith("quay.io/prometheuscommunity/postgres-exporter:v")
    assert exporter["environment"]["DATA_SOURCE_URI"].startswith("postgres:5432/")
    assert _targets(jobs["postgres"]) == ["postgres-exporter:9187"]  # its default port


def test_alertmanager_routes_every_alert_to_a_receiver() -> None:
    manager = _services()["alertmanager"]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in manager["volumes"] if v.startswith(".")}
    config_path = next(a.split("=", 1)[1] for a in manager["command"] if "config.file" in a)
    config = yaml.safe_load((COMPOSE_DIR / mounted[config_path]).read_text())
    receivers = {r["name"] for r in config["receivers"]}
    route = config["route"]
    assert route["receiver"] in receivers  # the root route catches what no child matches
    assert all(child.get("receiver", route["receiver"]) in receivers for child in route["routes"])
    rule_alerts = {
        r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]
    }
    for rule in config.get("inhibit_rules", []):
        for matcher in rule["source_matchers"]:
            name = matcher.split("=", 1)[1].strip('"')
            assert name in rule_alerts, f"inhibits on an alert that does not exist: {name}"
