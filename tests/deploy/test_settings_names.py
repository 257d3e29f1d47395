"""Every SERENTAK_* variable the compose file, the Kubernetes manifests and the replicated
deployment's templates (deploy/replicated/, docs/deploy-replicated.md) set names a real
setting (settings ignore unknown variables, so a typo would pass silently in production)."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic_settings import BaseSettings
from serentak.cli.parser import _ENVIRONMENT as CLI_ENVIRONMENT

from services.common.config import CommonSettings
from services.common.health_probe import ProbeSettings
from services.locks.settings import LocksSettings
from services.notify.settings import NotifySettings
from services.upload.settings import UploadSettings
from services.upload.sync.settings import SyncSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
FILES = [
    REPO_ROOT / "deploy" / "compose" / "compose.yaml",
    *sorted((REPO_ROOT / "deploy" / "k8s").rglob("*.yaml")),
    *sorted((REPO_ROOT / "deploy" / "replicated").glob("*.env")),
]
# Read by compose itself, not by a service.
COMPOSE_ONLY = {"SERENTAK_IMAGE"}
# Read by the serentak CLI for its flags' defaults (deploy/replicated/client.env names it).
CLI_ONLY = set(CLI_ENVIRONMENT.values())


def _env_names(cls: type[BaseSettings]) -> set[str]:
    prefix = cls.model_config.get("env_prefix", "")
    return {f"{prefix}{field}".upper() for field in cls.model_fields}


def test_every_variable_set_is_a_setting() -> None:
    known = set().union(
        *(
            _env_names(cls)
            for cls in (
                CommonSettings,
                UploadSettings,
                LocksSettings,
                NotifySettings,
                SyncSettings,
                ProbeSettings,
            )
        )
    )
    used: dict[str, set[str]] = {}
    for path in FILES:
        for name in re.findall(r"\b(SERENTAK_[A-Z0-9_]+)\b", path.read_text()):
            used.setdefault(name, set()).add(str(path.relative_to(REPO_ROOT)))
    assert len(used) > 20
    unknown = {n: sorted(w) for n, w in used.items() if n not in known | COMPOSE_ONLY | CLI_ONLY}
    assert unknown == {}, unknown
