"""deploy/k8s: the example overlay renders (our renderer; kubectl kustomize too where it is
installed, and both agree) into manifests that validate against the Kubernetes 1.37 schemas
and keep the promises of README "Deploying": native gRPC probes, headless Services for
self-balancing clients, PDBs, resources, non-root read-only pods, Secrets for TLS/JWT,
NetworkPolicies, a migrations Job, the Operator rules identical to alerts.yml."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from support.kustomize import render
from support.prometheus import ALERTS

from deploy.k8s.monitoring.sync_rules import prometheus_rule
from services.upload.settings import UploadSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
K8S = REPO_ROOT / "deploy" / "k8s"
OVERLAY = K8S / "overlays" / "example"
SERVICES = ("upload", "locks", "notify")


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render(OVERLAY)


def _get(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def test_every_object_validates_against_the_kubernetes_schemas(objects) -> None:
    assert len(objects) >= 20
    for obj in objects:
        kubernetes_validate.validate(obj, "1.37.0", strict=True)


def test_kubectl_kustomize_renders_the_same(objects) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed: our renderer alone is used")
    out = subprocess.run(
        [kubectl, "kustomize", str(OVERLAY)], check=True, capture_output=True, text=True
    ).stdout
    theirs = sorted((d for d in yaml.safe_load_all(out) if d), key=_key)
    assert theirs == sorted(objects, key=_key)


def test_deployments_probe_grpc_run_non_root_read_only_with_resources(objects) -> None:
    config = _get(objects, "ConfigMap", "serentak-config")["data"]
    health_port = int(config["SERENTAK_HEALTH_PORT"])
    for name in SERVICES:
        deployment = _get(objects, "Deployment", name)
        assert deployment["spec"]["replicas"] >= 2
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        (container,) = pod["containers"]
        assert container["image"] == "registry.example.com/serentak:0.1.0"
        assert container["args"] == [f"services.{name}"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == health_port, (name, probe)
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])
        assert {"cpu", "memory"} <= set(container["resources"]["limits"])
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert {"/tmp", "/var/lib/serentak", "/etc/serentak/tls"} <= mounts
        pdb = _get(objects, "PodDisruptionBudget", name)
        assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert _get(objects, "Deployment", "upload")["spec"]["replicas"] == 3  # overlay patch


def test_tls_and_jwt_settings_point_at_mounted_secrets(objects) -> None:
    config = _get(objects, "ConfigMap", "serentak-config")["data"]
    assert config["SERENTAK_AUTH_MODE"] == "jwt"
    assert config["SERENTAK_MIGRATE_ON_START"] == "false"
    assert config["SERENTAK_BLOB_URL"].startswith("s3://")
    assert config["SERENTAK_TLS_CLIENT_CA_FILE"]  # mutual TLS between services
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    for name in SERVICES:
        pod = _get(objects, "Deployment", name)["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for mount in container["volumeMounts"]:
            volume = volumes[mount["name"]]
            if "secret" in volume:
                secret = secrets[volume["secret"]["secretName"]]
                for path_key in ("SERENTAK_TLS_CERT_FILE", "SERENTAK_TLS_KEY_FILE"):
                    if config[path_key].startswith(mount["mountPath"] + "/"):
                        assert config[path_key].rsplit("/", 1)[1] in secret["stringData"]
        names = {e["name"] for e in container.get("env", [])}
        assert "SERENTAK_PAGE_TOKEN_SECRET" in names, name  # one key for all replicas
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["key"] in secrets[ref["name"]]["stringData"], env["name"]
    for secret in secrets.values():
        assert all("REPLACE_ME" in v for v in secret["stringData"].values()), "placeholders only"


def test_every_pod_mounts_only_its_own_secrets(objects) -> None:
    # Per-service Secrets (never one PKI Secret for all): no pod can read another's key.
    own = {name: {f"serentak-{name}-tls", f"serentak-{name}-token"} for name in SERVICES}
    own["locks"].add("serentak-etcd-client")
    for kind, name in [("Deployment", s) for s in SERVICES] + [("Job", "serentak-migrate-0.1.0")]:
        pod = _get(objects, kind, name)["spec"]["template"]["spec"]
        mounted = {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
        assert mounted == own.get(name, set()), (name, mounted)


def test_headless_services_for_self_balancing_clients(objects) -> None:
    for name in ("locks", "notify", "upload-headless"):
        service = _get(objects, "Service", name)
        assert service["spec"]["clusterIP"] == "None"
        assert service["metadata"]["labels"]["serentak.io/scrape-job"].startswith("serentak-")
    assert _get(objects, "Service", "upload")["spec"]["type"] == "ClusterIP"


def test_the_tus_door_is_served_exposed_and_admitted(objects) -> None:
    config = _get(objects, "ConfigMap", "serentak-config")["data"]
    assert config["SERENTAK_TUS_ENABLED"] == "true"
    (container,) = _get(objects, "Deployment", "upload")["spec"]["template"]["spec"]["containers"]
    port = UploadSettings.model_fields["tus_port"].default
    assert {"name": "tus", "containerPort": port} in container["ports"]
    service_ports = _get(objects, "Service", "upload")["spec"]["ports"]
    assert {"name": "tus", "port": port, "targetPort": "tus", "appProtocol": "https"} in (
        service_ports
    )
    (api_rule, _metrics) = _get(objects, "NetworkPolicy", "upload-ingress")["spec"]["ingress"]
    assert {"protocol": "TCP", "port": "tus"} in api_rule["ports"]


def test_network_policies_only_upload_and_labelled_clients_reach_locks_and_notify(
    objects,
) -> None:
    deny = _get(objects, "NetworkPolicy", "serentak-default-deny")
    assert deny["spec"]["policyTypes"] == ["Ingress"] and "ingress" not in deny["spec"]
    for name in ("locks", "notify"):
        rules = _get(objects, "NetworkPolicy", f"{name}-ingress")["spec"]["ingress"]
        grpc_rule, metrics_rule = rules
        assert grpc_rule["ports"] == [{"protocol": "TCP", "port": "grpc"}]
        assert {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "upload"}}} in grpc_rule[
            "from"
        ]
        assert all("namespaceSelector" not in peer for peer in grpc_rule["from"])
        # Another service of the namespace using the SDK (hold(), Subscribe) opts in by label.
        client = {"podSelector": {"matchLabels": {f"serentak.io/{name}-client": "true"}}}
        assert client in grpc_rule["from"], name
        assert len(grpc_rule["from"]) == 2, grpc_rule["from"]  # nothing else
        assert metrics_rule["ports"] == [{"protocol": "TCP", "port": "metrics"}]
        (prometheus,) = metrics_rule["from"]
        assert prometheus["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "prometheus"


def test_each_release_applies_its_own_migrations_job_which_deletes_itself(objects) -> None:
    # A Job's template is immutable: re-applying one name with a new image fails, so the
    # name carries the release (the image tag) and a finished Job goes away by itself.
    (job,) = [o for o in objects if o["kind"] == "Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    tag = container["image"].rsplit(":", 1)[1]
    assert job["metadata"]["name"] == f"serentak-migrate-{tag}"
    assert 0 < job["spec"]["ttlSecondsAfterFinished"] <= 7 * 86400
    assert not [o for o in render(K8S / "base") if o["kind"] == "Job"]  # only by release


def test_migrations_job_runs_the_migrate_command(objects) -> None:
    job = _get(objects, "Job", "serentak-migrate-0.1.0")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["services.migrate", "all"]
    assert (REPO_ROOT / "services" / "common" / "migrate.py").exists()
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    names = {e["name"] for e in container["env"]}
    assert names == {"SERENTAK_UPLOAD_DATABASE_URL", "SERENTAK_NOTIFY_DATABASE_URL"}


def test_operator_rules_are_the_alerts_file() -> None:
    rule = yaml.safe_load((K8S / "monitoring" / "prometheusrule.yaml").read_text())
    assert rule == prometheus_rule(), "run: python -m deploy.k8s.monitoring.sync_rules"
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]
    monitor = yaml.safe_load((K8S / "monitoring" / "servicemonitor.yaml").read_text())
    assert monitor["spec"]["jobLabel"] == "serentak.io/scrape-job"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "interval": "15s"}]


def test_plain_scrape_config_keeps_metrics_ports_and_names_jobs_like_the_alerts() -> None:
    # Debian's promtool is built without Kubernetes service discovery, so this config is
    # checked by structure here (the Operator variant above is what the test suite ties to).
    (job,) = yaml.safe_load((K8S / "monitoring" / "prometheus-scrape.yml").read_text())[
        "scrape_configs"
    ]
    assert job["kubernetes_sd_configs"] == [
        {"role": "endpoints", "namespaces": {"names": ["serentak"]}}
    ]
    label = "__meta_kubernetes_service_label_serentak_io_scrape_job"
    keep, port, rename, _pod = job["relabel_configs"]
    assert keep == {"source_labels": [label], "regex": "serentak-.+", "action": "keep"}
    assert port["regex"] == "metrics" and port["action"] == "keep"
    assert rename == {"source_labels": [label], "target_label": "job"}
