"""The bearer token this process sends when it calls another service (as its principal).

dev mode: the principal's dev token from the table (`dev-service-upload`, ...).
jwt mode: a client-credentials token from `SERENTAK_CLIENT_TOKEN_FILE` (re-read when the
file changes, so whatever renews it, e.g. a sidecar, needs no restart) or a static
`SERENTAK_CLIENT_TOKEN`; with neither, the service authenticates with its mTLS
client certificate alone.
"""

from __future__ import annotations

import threading
from pathlib import Path

import grpc

from services.common.config import CommonSettings, ConfigError
from services.common.logging import get_logger

log = get_logger(__name__)


class ClientToken(grpc.AuthMetadataPlugin):
    """A gRPC call-credentials plugin adding `authorization: Bearer <token>` to each call."""

    def __init__(self, token: str | None = None, path: Path | None = None) -> None:
        if (token is None) == (path is None):
            raise ValueError("give exactly one of token and path")
        self._token = token
        self._path = path
        self._stamp: tuple[int, int] | None = None
        self._lock = threading.Lock()

    def current(self) -> str:
        """The token now: the file's content when it changed since the last read."""
        if self._path is None:
            assert self._token is not None
            return self._token
        with self._lock:
            try:
                st = self._path.stat()
                stamp = (st.st_mtime_ns, st.st_size)
                if stamp != self._stamp:
                    self._token = self._path.read_text().strip()
                    self._stamp = stamp
            except OSError as exc:
                if self._token is None:
                    raise
                log.warning("client_token_reread_failed", path=str(self._path), error=str(exc))
            assert self._token is not None
            return self._token

    def __call__(
        self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback
    ) -> None:
        try:
            token = self.current()
        except OSError as exc:
            callback((), exc)
            return
        callback((("authorization", f"Bearer {token}"),), None)


def service_token(settings: CommonSettings, principal: str) -> ClientToken | None:
    """How this service (as `principal`) authenticates its calls; None: mTLS only."""
    if settings.client_token_file is not None:
        from_file = ClientToken(path=settings.client_token_file)
        try:
            from_file.current()  # read at start: a missing file is a start-up error
        except OSError as exc:
            raise ConfigError(f"SERENTAK_CLIENT_TOKEN_FILE: {exc}") from exc
        return from_file
    if settings.client_token is not None:
        return ClientToken(token=settings.client_token)
    if settings.auth_mode == "dev":
        for token, name in settings.auth_service_tokens.items():
            if name == principal:
                return ClientToken(token=token)
        raise ConfigError(f"no dev token for principal {principal} in SERENTAK_AUTH_SERVICE_TOKENS")
    return None
