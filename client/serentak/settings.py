"""The few `SERENTAK_*` variables a client reads, with the server's names and meaning.

`ClientSettings.from_environ()` reads them once (names case-insensitive, as the server's
settings read them); the command line passes the object down. The server maps its own
settings onto this class (services.common.channels.client_settings), so a service and a
command line given the same environment call the same way.

    SERENTAK_UPLOAD_ADDRESS / _LOCKS_ADDRESS / _NOTIFY_ADDRESS   where the services are
    SERENTAK_TLS_CA_FILE, SERENTAK_TLS_CLIENT_CERT_FILE / _KEY_FILE   TLS (mTLS) files
    SERENTAK_UPLOAD_TLS_SERVER_NAME / _LOCKS_... / _NOTIFY_...   the name each service's
        certificates carry, verified instead of the address (needed for a list of IPs)
    SERENTAK_CLIENT_TOKEN_FILE (re-read on change) or SERENTAK_CLIENT_TOKEN   bearer token
    SERENTAK_AUTH_MODE (dev|jwt), SERENTAK_AUTH_SERVICE_TOKENS (JSON)   dev-mode principals
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from serentak.errors import ConfigError

# Dev-mode service principals: bearer token -> principal (each service calls the others as
# itself; `ops` is the operator role for admin RPCs). Production uses `jwt` mode instead.
DEFAULT_SERVICE_TOKENS: dict[str, str] = {
    "dev-service-upload": "upload",
    "dev-service-notify": "notify",
    "dev-service-locks": "locks",
    "dev-ops": "ops",
}
AUTH_MODES = ("dev", "jwt")
_PREFIX = "serentak_"


@dataclass(frozen=True)
class ClientSettings:
    """What a client needs to find and authenticate to the services."""

    upload_address: str = "127.0.0.1:50051"
    locks_address: str = "127.0.0.1:50052"
    notify_address: str = "127.0.0.1:50053"
    auth_mode: str | None = None
    auth_service_tokens: Mapping[str, str] = field(
        default_factory=lambda: dict(DEFAULT_SERVICE_TOKENS)
    )
    client_token: str | None = None
    client_token_file: Path | None = None
    tls_ca_file: Path | None = None
    tls_client_cert_file: Path | None = None
    tls_client_key_file: Path | None = None
    upload_tls_server_name: str = ""
    locks_tls_server_name: str = ""
    notify_tls_server_name: str = ""

    def __post_init__(self) -> None:
        if self.auth_mode is not None and self.auth_mode not in AUTH_MODES:
            raise ConfigError(f"SERENTAK_AUTH_MODE must be one of {AUTH_MODES}")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> ClientSettings:
        """The settings in `environ` (default: the process environment)."""
        env = {k.lower(): v for k, v in (os.environ if environ is None else environ).items()}

        def text(name: str) -> str | None:
            return env.get(_PREFIX + name)

        def path(name: str) -> Path | None:
            value = text(name)
            return None if value is None else Path(value)

        defaults = cls()
        return cls(
            upload_address=_or(text("upload_address"), defaults.upload_address),
            locks_address=_or(text("locks_address"), defaults.locks_address),
            notify_address=_or(text("notify_address"), defaults.notify_address),
            auth_mode=text("auth_mode"),
            auth_service_tokens=_tokens(text("auth_service_tokens"), defaults),
            client_token=text("client_token"),
            client_token_file=path("client_token_file"),
            tls_ca_file=path("tls_ca_file"),
            tls_client_cert_file=path("tls_client_cert_file"),
            tls_client_key_file=path("tls_client_key_file"),
            upload_tls_server_name=text("upload_tls_server_name") or "",
            locks_tls_server_name=text("locks_tls_server_name") or "",
            notify_tls_server_name=text("notify_tls_server_name") or "",
        )


def _or(value: str | None, default: str) -> str:
    return default if value is None else value


def _tokens(raw: str | None, defaults: ClientSettings) -> Mapping[str, str]:
    """SERENTAK_AUTH_SERVICE_TOKENS: a JSON object of token -> principal."""
    if raw is None:
        return defaults.auth_service_tokens
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"SERENTAK_AUTH_SERVICE_TOKENS is not JSON: {exc}") from exc
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError("SERENTAK_AUTH_SERVICE_TOKENS must be a JSON object of strings")
    return value
