"""A small kustomize renderer for the tests (no kubectl in CI): resources, namespace,
images, labels (metadata only), nameSuffix and strategic-merge patches by kind and name —
the features deploy/k8s uses. Anything else in a kustomization.yaml is an error, not
silently skipped."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "images",
    "labels",
    "patches",
    "nameSuffix",
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
# Strategic-merge keys of the lists deploy/k8s patches.
MERGE_KEYS = {"containers": "name", "env": "name", "volumes": "name", "volumeMounts": "mountPath"}


def render(directory: Path) -> list[dict[str, Any]]:
    """Every object the kustomization in `directory` produces."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(spec) - SUPPORTED
    if unknown:
        raise ValueError(f"{directory}: unsupported kustomization fields {sorted(unknown)}")
    objects: list[dict[str, Any]] = []
    for resource in spec.get("resources", []):
        path = (directory / resource).resolve()
        if path.is_dir():
            objects.extend(render(path))
        else:
            objects.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    for patch in spec.get("patches", []):
        body = yaml.safe_load((directory / patch["path"]).read_text())
        target = [
            o
            for o in objects
            if o["kind"] == body["kind"] and o["metadata"]["name"] == body["metadata"]["name"]
        ]
        if len(target) != 1:
            raise ValueError(f"patch {patch['path']} matches {len(target)} objects")
        _merge(target[0], {k: v for k, v in body.items() if k not in {"apiVersion", "kind"}})
    # Renames only (no object of a suffixed kustomization is referenced by name elsewhere).
    for obj in objects:
        if obj["kind"] not in CLUSTER_SCOPED:
            obj["metadata"]["name"] += spec.get("nameSuffix", "")
    for entry in spec.get("labels", []):
        for obj in objects:
            obj["metadata"].setdefault("labels", {}).update(entry["pairs"])
    for image in spec.get("images", []):
        for container in _containers(objects):
            if container["image"].split(":")[0] == image["name"]:
                name = image.get("newName", image["name"])
                container["image"] = f"{name}:{image['newTag']}" if "newTag" in image else name
    if "namespace" in spec:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = spec["namespace"]
    return objects


def _containers(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for obj in objects:
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        found.extend(pod.get("containers", []) + pod.get("initContainers", []))
    return found


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        elif isinstance(value, list) and key in MERGE_KEYS and isinstance(into.get(key), list):
            merge_key = MERGE_KEYS[key]
            for item in value:
                same = [i for i in into[key] if i.get(merge_key) == item.get(merge_key)]
                if same:
                    _merge(same[0], item)
                else:
                    into[key].append(copy.deepcopy(item))
        else:
            into[key] = copy.deepcopy(value)
