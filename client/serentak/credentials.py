"""How a client proves who it talks to (TLS) and who it is (a bearer token, a certificate).

`ClientSecurity` = TLS files (`ClientTls`) + a bearer token (`ClientToken`, sent by gRPC as
call credentials on every call). Without TLS, a channel carrying a token uses local
credentials, which gRPC lets reach loopback only: a token never crosses a network in clear.
With neither (a health probe) the channel is plainly insecure.

Where they come from:
- a command line's flags: `user_client_security(token, ca_file, cert_file, key_file)`;
- the settings (`serentak.settings.ClientSettings`): `settings_tls`, and `settings_token`
  for a principal (a service, or `ops` for the admin commands): a token file re-read when
  it changes (whatever renews it, e.g. a sidecar, needs no restart), a static token, or in
  dev mode the principal's dev token; with none, the mTLS client certificate alone;
- both: `operator_security`, flags first and the settings for what the flags leave out.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc

from serentak._logging import get_logger
from serentak.errors import ConfigError
from serentak.settings import ClientSettings

log = get_logger(__name__)

# The operator principal of the admin RPCs.
OPS = "ops"


@dataclass(frozen=True)
class ClientTls:
    """What a client trusts (`ca_file`) and, for mTLS, the certificate it presents."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    # The name the server certificate carries, when it does not list the dialled address.
    server_name: str = ""


class ClientToken(grpc.AuthMetadataPlugin):  # type: ignore[misc]  # grpcio has no types
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


def channel_credentials(tls: ClientTls | None) -> grpc.ChannelCredentials:
    """SSL credentials for `tls`, or local (loopback-only, plaintext) credentials."""
    if tls is None:
        # Plaintext, but still "secure" to gRPC so call credentials (tokens) may ride on
        # it; gRPC refuses a non-loopback peer with these.
        return grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    try:
        return grpc.ssl_channel_credentials(
            root_certificates=tls.ca_file.read_bytes() if tls.ca_file else None,
            private_key=tls.key_file.read_bytes() if tls.key_file else None,
            certificate_chain=tls.cert_file.read_bytes() if tls.cert_file else None,
        )
    except OSError as exc:
        raise ConfigError(f"cannot read client TLS files: {exc}") from exc


@dataclass(frozen=True)
class ClientSecurity:
    """How a channel proves who it talks to (TLS) and who it is (token, client cert)."""

    tls: ClientTls | None = None
    token: ClientToken | None = None

    @property
    def plaintext(self) -> bool:
        """No TLS and no token: nothing to protect (health probes), any address."""
        return self.tls is None and self.token is None

    @property
    def server_name(self) -> str:
        """The TLS name to verify instead of the dialled address ("": the address's)."""
        return self.tls.server_name if self.tls is not None else ""

    def with_server_name(self, name: str) -> ClientSecurity:
        """This security verifying the server as `name` ("" keeps it as it is).

        A list of addresses (`10.0.0.1:50052,10.0.0.2:50052`) names no host a certificate
        could carry, so a TLS channel to one needs the name its replicas' certificates share.
        """
        if not name:
            return self
        if self.tls is None:
            raise ConfigError(
                f"TLS server name {name!r} given without TLS: set the CA "
                "(SERENTAK_TLS_CA_FILE, --ca) too"
            )
        return replace(self, tls=replace(self.tls, server_name=name))

    def options(self) -> list[tuple[str, Any]]:
        """Channel options the security needs: the name to verify, also sent as :authority."""
        if self.tls is not None and self.tls.server_name:
            return [
                ("grpc.ssl_target_name_override", self.tls.server_name),
                ("grpc.default_authority", self.tls.server_name),
            ]
        return []

    def credentials(self) -> grpc.ChannelCredentials:
        """Channel credentials, composed with the token's call credentials if any."""
        creds = channel_credentials(self.tls)
        if self.token is None:
            return creds
        return grpc.composite_channel_credentials(creds, grpc.metadata_call_credentials(self.token))


def user_client_security(
    token: str | None,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
) -> ClientSecurity:
    """A command line: the token and TLS files it was given (`--token`, `--ca`, ...)."""
    tls = None
    if ca_file or cert_file or key_file:
        if bool(cert_file) != bool(key_file):
            raise ConfigError("give both --cert and --key")
        tls = ClientTls(
            Path(ca_file) if ca_file else None,
            Path(cert_file) if cert_file else None,
            Path(key_file) if key_file else None,
        )
    return ClientSecurity(tls=tls, token=ClientToken(token=token) if token else None)


def settings_tls(settings: ClientSettings) -> ClientTls | None:
    """The client TLS files from settings, None for plaintext (loopback only)."""
    ca, cert, key = (
        settings.tls_ca_file,
        settings.tls_client_cert_file,
        settings.tls_client_key_file,
    )
    if (cert is None) != (key is None):
        raise ConfigError("set both SERENTAK_TLS_CLIENT_CERT_FILE and SERENTAK_TLS_CLIENT_KEY_FILE")
    if ca is None and cert is None:
        return None
    return ClientTls(ca, cert, key)


def settings_token(settings: ClientSettings, principal: str) -> ClientToken | None:
    """How `principal` authenticates its calls per the settings; None: mTLS only."""
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


def operator_security(
    settings: ClientSettings,
    token: str | None = None,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
) -> ClientSecurity:
    """The admin commands' credentials: flags first; the settings (TLS files, the `ops`
    principal's token) for what is not given. A client certificate given on the command
    line is the credential: no settings token."""
    flags = user_client_security(token, ca_file, cert_file, key_file)
    tls = flags.tls or settings_tls(settings)
    bearer = flags.token
    cert_given = flags.tls is not None and flags.tls.cert_file is not None
    if bearer is None and not cert_given:
        bearer = settings_token(settings, OPS)
    if bearer is None and (tls is None or tls.cert_file is None):
        raise ConfigError(
            "no credentials: pass --token (or --cert/--key), or set "
            "SERENTAK_CLIENT_TOKEN[_FILE] (or SERENTAK_AUTH_MODE=dev for the dev ops token)"
        )
    return ClientSecurity(tls=tls, token=bearer)


__all__ = [
    "OPS",
    "ClientSecurity",
    "ClientTls",
    "ClientToken",
    "channel_credentials",
    "operator_security",
    "settings_tls",
    "settings_token",
    "user_client_security",
]
