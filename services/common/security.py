"""What a server needs to guard its door: the auth mode, its TLS files, its authenticator."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.auth import Authenticator, build_authenticator, require_mode
from services.common.config import CommonSettings
from services.common.tls import ServerTls, server_tls


@dataclass(frozen=True)
class ServerSecurity:
    """`auth_mode` dev|jwt; `tls` None = plaintext; `authenticator` gets its keys fetched
    before each RPC (rpc_wrapper.py)."""

    auth_mode: str
    tls: ServerTls | None = None
    authenticator: Authenticator | None = None


def server_security(
    settings: CommonSettings, authenticator: Authenticator | None = None
) -> ServerSecurity:
    """From settings; raises ConfigError without an auth mode, with incomplete jwt settings
    or with half a TLS config. Builds the authenticator if the service has none to give."""
    mode = require_mode(settings)
    return ServerSecurity(
        mode, server_tls(settings), authenticator or build_authenticator(settings)
    )
