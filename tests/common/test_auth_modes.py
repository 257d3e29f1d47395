"""No silent dev default: a service without an auth mode refuses to start, dev mode refuses
to listen off loopback and says once, loudly, that it is dev mode; bad jwt settings stop
the service at start, not at the first call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.ports import free_port
from support.services import REPO_ROOT, running_app, service_process

from services.common.auth import build_authenticator
from services.common.channels import service_client_security
from services.common.config import CommonSettings, ConfigError
from services.common.grpc_server import ServiceApp
from services.common.security import ServerSecurity


def _run(name: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SERENTAK_")}
    return subprocess.run(
        [sys.executable, "-m", f"services.{name}"],
        cwd=REPO_ROOT,
        env={
            **base,
            "PYTHONPATH": str(REPO_ROOT),
            "SERENTAK_DATA_DIR": str(tmp_path),
            f"SERENTAK_{name.upper()}_PORT": str(free_port()),
            f"SERENTAK_{name.upper()}_METRICS_PORT": str(free_port()),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("name", ["locks", "upload", "notify"])
def test_a_service_without_auth_mode_refuses_to_start(name: str, tmp_path: Path) -> None:
    done = _run(name, tmp_path)
    assert done.returncode == 2
    assert "refusing to start: SERENTAK_AUTH_MODE is not set" in done.stderr
    # Refused before touching anything: no database was created.
    assert not list(tmp_path.glob("*.db"))


def test_dev_mode_refuses_a_non_loopback_bind(tmp_path: Path) -> None:
    done = _run("locks", tmp_path, SERENTAK_AUTH_MODE="dev", SERENTAK_BIND_HOST="0.0.0.0")
    assert done.returncode == 2
    assert "refusing to listen on 0.0.0.0 in dev mode" in done.stderr


def test_dev_mode_warns_once_at_start(tmp_path: Path) -> None:
    with service_process("locks", tmp_path) as svc:
        log = svc.log_text()
    assert log.count("auth_dev_mode") == 1


def test_jwt_mode_needs_its_issuer_settings_and_a_safe_algorithm_list(tmp_path: Path) -> None:
    done = _run("locks", tmp_path, SERENTAK_AUTH_MODE="jwt")
    assert done.returncode == 2 and "SERENTAK_AUTH_JWKS_URL" in done.stderr
    complete = {
        "auth_mode": "jwt",
        "auth_jwks_url": "http://127.0.0.1:9/jwks",
        "auth_jwt_issuer": "https://idp.test",
        "auth_jwt_audience": "serentak",
    }
    build_authenticator(CommonSettings(**complete))  # complete: accepted
    for algorithms in (["none"], ["RS256", "HS256"], ["RS999"], []):
        with pytest.raises(ConfigError):
            build_authenticator(CommonSettings(**complete, auth_jwt_algorithms=algorithms))
    with pytest.raises(ConfigError, match="SERENTAK_AUTH_MODE is not set"):
        build_authenticator(CommonSettings(auth_mode=None))


def test_a_service_needs_a_credential_for_its_own_calls(tmp_path: Path) -> None:
    jwt = {
        "auth_mode": "jwt",
        "auth_jwks_url": "http://127.0.0.1:9/jwks",
        "auth_jwt_issuer": "https://idp.test",
        "auth_jwt_audience": "serentak",
    }
    with pytest.raises(ConfigError, match="no credential"):
        service_client_security(CommonSettings(**jwt), "upload")
    with pytest.raises(ConfigError, match="SERENTAK_CLIENT_TOKEN_FILE"):
        service_client_security(
            CommonSettings(**jwt, client_token_file=tmp_path / "missing"), "upload"
        )
    token_file = tmp_path / "upload.jwt"
    token_file.write_text("a.b.c\n")
    by_token = service_client_security(
        CommonSettings(**jwt, client_token_file=token_file), "upload"
    )
    assert by_token.token is not None and by_token.token.current() == "a.b.c"
    # dev mode: the principal's dev token.
    dev = service_client_security(CommonSettings(auth_mode="dev"), "upload")
    assert dev.token is not None and dev.token.current() == "dev-service-upload"


async def test_an_app_without_declared_security_stays_on_loopback() -> None:
    for security in (None, ServerSecurity("dev")):
        with pytest.raises(ConfigError, match="refusing to listen"):
            async with running_app(ServiceApp("t", "0.0.0.0", 0, 0, [], security=security)):
                pass
    async with running_app(ServiceApp("t", "127.0.0.1", 0, 0, [])) as running:
        assert running.app.bound_port > 0
