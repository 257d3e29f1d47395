"""Every outgoing gRPC channel is made here: target, retries, keepalive, TLS, call token.

    channel = open_channel(settings.locks_address, service_client_security(settings, LOCKS_CALLER),
                           retry=["serentak.locks.v1.LockService/Release"])

- Targets: `host:port`; several IP addresses `10.0.0.1:50052,10.0.0.2:50052`; or a DNS
  name resolved to all its addresses, `dns:///locks.internal:50052`. Calls are spread
  over the addresses (round_robin).
- Retries: the methods in `retry` (whole services or `Service/Method`) are retried by
  gRPC itself on UNAVAILABLE, with backoff. Name only idempotent calls.
- Keepalive: a ping every 30 s on a connection with calls, so a dead peer behind a NAT
  or load balancer is noticed in ~40 s, not at the next TCP timeout.
- Security: `ClientSecurity` = TLS files + the bearer token as call credentials (gRPC
  attaches it to each call). Without TLS, a channel carrying a token uses local
  credentials, which gRPC lets reach loopback only: a token never crosses a network in
  clear. With neither (a health probe) it is a plain insecure channel.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from services.common.auth.client_token import ClientToken, service_token
from services.common.config import CommonSettings, ConfigError
from services.common.tls import ClientTls, channel_credentials, client_tls

_KEEPALIVE = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
]
_RETRY_POLICY = {
    "maxAttempts": 4,
    "initialBackoff": "0.1s",
    "maxBackoff": "2s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}


@dataclass(frozen=True)
class ClientSecurity:
    """How a channel proves who it talks to (TLS) and who it is (token, client cert)."""

    tls: ClientTls | None = None
    token: ClientToken | None = None

    @property
    def plaintext(self) -> bool:
        """No TLS and no token: nothing to protect (health probes), any address."""
        return self.tls is None and self.token is None

    def options(self) -> list[tuple[str, Any]]:
        """Channel options the security needs (the TLS name override)."""
        if self.tls is not None and self.tls.server_name:
            return [("grpc.ssl_target_name_override", self.tls.server_name)]
        return []

    def credentials(self) -> grpc.ChannelCredentials:
        """Channel credentials, composed with the token's call credentials if any."""
        creds = channel_credentials(self.tls)
        if self.token is None:
            return creds
        return grpc.composite_channel_credentials(creds, grpc.metadata_call_credentials(self.token))


def service_client_security(settings: CommonSettings, principal: str) -> ClientSecurity:
    """A service calling another as `principal`: TLS and token from its settings.

    In jwt mode a service with neither a token nor a client certificate could only call
    anonymously, which every service refuses: that is a start-up error, not a runtime one.
    """
    tls, token = client_tls(settings), service_token(settings, principal)
    if token is None and (tls is None or tls.cert_file is None):
        raise ConfigError(
            f"the {principal} service has no credential to call the others with: set "
            "SERENTAK_CLIENT_TOKEN_FILE (or SERENTAK_CLIENT_TOKEN), or a client certificate "
            "(SERENTAK_TLS_CLIENT_CERT_FILE/KEY_FILE) mapped by SERENTAK_AUTH_MTLS_PRINCIPALS"
        )
    return ClientSecurity(tls=tls, token=token)


def user_client_security(
    token: str | None,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
) -> ClientSecurity:
    """A command line: the token and TLS files it was given (`--token`, `--ca`, ...)."""
    from pathlib import Path

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


def _ip_address(address: str) -> str | None:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    try:
        return "ipv6" if ipaddress.ip_address(host.strip("[]")).version == 6 else "ipv4"
    except ValueError:
        return None


def target(address: str) -> str:
    """The gRPC target for an address setting (see the module docstring)."""
    address = address.strip()
    if ":///" in address or address.startswith(("dns:", "ipv4:", "ipv6:", "unix:")):
        return address
    parts = [p.strip() for p in address.split(",") if p.strip()]
    if len(parts) <= 1:
        return address
    families = {_ip_address(p) for p in parts}
    if len(families) != 1 or None in families:
        raise ConfigError(
            f"{address!r}: a list must be IP:port of one family; use dns:///NAME:PORT for names"
        )
    return f"{families.pop()}:{','.join(parts)}"


def _method_name(name: str) -> dict[str, str]:
    service, _, method = name.partition("/")
    return {"service": service, "method": method} if method else {"service": service}


def service_config(retry: Sequence[str] = ()) -> str:
    """The JSON service config: round_robin, and retries for the `retry` methods."""
    config: dict[str, Any] = {"loadBalancingConfig": [{"round_robin": {}}]}
    if retry:
        config["methodConfig"] = [
            {"name": [_method_name(n) for n in retry], "retryPolicy": _RETRY_POLICY}
        ]
    return json.dumps(config)


def channel_options(
    retry: Sequence[str] = (), options: Sequence[tuple[str, Any]] = ()
) -> list[tuple[str, Any]]:
    """Options every channel gets (service config, keepalive) plus the caller's."""
    return [
        ("grpc.service_config", service_config(retry)),
        ("grpc.enable_retries", 1),
        *_KEEPALIVE,
        *options,
    ]


def open_channel(
    address: str,
    security: ClientSecurity,
    *,
    retry: Sequence[str] = (),
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """A grpc.aio channel to `address` (create it inside the event loop that uses it)."""
    opts = channel_options(retry, [*security.options(), *options])
    if security.plaintext:
        return grpc.aio.insecure_channel(target(address), options=opts)
    return grpc.aio.secure_channel(target(address), security.credentials(), options=opts)


def open_sync_channel(
    address: str,
    security: ClientSecurity,
    *,
    retry: Sequence[str] = (),
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """A blocking channel, for command lines and health probes."""
    opts = channel_options(retry, [*security.options(), *options])
    if security.plaintext:
        return grpc.insecure_channel(target(address), options=opts)
    return grpc.secure_channel(target(address), security.credentials(), options=opts)
