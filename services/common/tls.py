"""TLS for every server: one place that turns certificate files into server credentials
(gRPC) and HTTPS contexts (the HTTP doors: tus).

Servers: `server_credentials` serves the certificate in `SERENTAK_TLS_CERT_FILE` /
`SERENTAK_TLS_KEY_FILE` and, with `SERENTAK_TLS_CLIENT_CA_FILE`, requires client
certificates signed by that CA (mTLS). gRPC asks our fetcher for the configuration at
every new handshake; the fetcher re-reads the files only when their mtime or size
changed, so a renewed certificate (cert-manager, certbot: replace the files atomically)
is served to new connections without a restart.

HTTP doors (`HttpsCertificate`): the same certificate and key, no client certificate asked
(their callers, browsers and tus clients, authenticate with bearer tokens); `refresh`
loads renewed files into the same context, so new connections get them.

Clients: the client package's `serentak.credentials` (`ClientTls`, `channel_credentials`),
which the services use for their own calls too (services.common.channels).
"""

from __future__ import annotations

import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

from services.common.config import CommonSettings, ConfigError
from services.common.logging import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class ServerTls:
    """A server's certificate and key; with `client_ca_file`, clients must present one."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None


def server_tls(settings: CommonSettings) -> ServerTls | None:
    """The server TLS files from settings, None for plaintext; both or neither of cert/key."""
    cert, key, ca = settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file
    if cert is None and key is None:
        if ca is not None:
            raise ConfigError("SERENTAK_TLS_CLIENT_CA_FILE needs SERENTAK_TLS_CERT_FILE/KEY_FILE")
        return None
    if cert is None or key is None:
        raise ConfigError("set both SERENTAK_TLS_CERT_FILE and SERENTAK_TLS_KEY_FILE")
    tls = ServerTls(cert, key, ca)
    _read_server_config(tls)  # fail at start, not at the first handshake
    return tls


def _stamp(paths: list[Path]) -> tuple[tuple[int, int, int], ...]:
    stats = [p.stat() for p in paths]
    return tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in stats)


def _read_server_config(tls: ServerTls) -> grpc.ServerCertificateConfiguration:
    try:
        key, chain = tls.key_file.read_bytes(), tls.cert_file.read_bytes()
        ca = tls.client_ca_file.read_bytes() if tls.client_ca_file else None
    except OSError as exc:
        raise ConfigError(f"cannot read TLS files: {exc}") from exc
    return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=ca)


class _CertificateReloader:
    """gRPC's certificate config fetcher: a new configuration when the files changed."""

    def __init__(self, tls: ServerTls) -> None:
        self._tls = tls
        self._paths = [p for p in (tls.cert_file, tls.key_file, tls.client_ca_file) if p]
        self._lock = threading.Lock()
        self._stamp = _stamp(self._paths)

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC (any thread) at each handshake: a stat per file, a read on change.
        with self._lock:
            try:
                stamp = _stamp(self._paths)
                if stamp == self._stamp:
                    return None
                config = _read_server_config(self._tls)
            except (OSError, ConfigError) as exc:
                log.warning("tls_reload_failed", error=str(exc))
                return None  # keep serving the certificate we have
            self._stamp = stamp
            log.info("tls_certificate_reloaded", cert_file=str(self._tls.cert_file))
            return config


def server_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """Credentials that follow the files on disk; mTLS when a client CA is set."""
    return grpc.dynamic_ssl_server_credentials(
        _read_server_config(tls),
        _CertificateReloader(tls),
        require_client_authentication=tls.client_ca_file is not None,
    )


class HttpsCertificate:
    """An HTTPS server context on the TLS files, following them as they are renewed."""

    def __init__(self, tls: ServerTls) -> None:
        self._tls = tls
        self._paths = [tls.cert_file, tls.key_file]
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp = _stamp(self._paths)
        self._load()

    def _load(self) -> None:
        try:
            self.context.load_cert_chain(self._tls.cert_file, self._tls.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load TLS files: {exc}") from exc

    def refresh(self) -> bool:
        """Load the files again if they changed (True if it did); keeps the old on error."""
        try:
            stamp = _stamp(self._paths)
            if stamp == self._stamp:
                return False
            self._load()
        except (OSError, ConfigError) as exc:
            log.warning("tls_reload_failed", error=str(exc))
            return False
        self._stamp = stamp
        log.info("tls_certificate_reloaded", cert_file=str(self._tls.cert_file))
        return True
