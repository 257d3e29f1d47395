"""Every channel to a Serentak service is made here: target, retries, keepalive, credentials.

    channel = open_channel("locks.internal:50052", security,
                           retry=["serentak.locks.v1.LockService/Release"])

- Targets: `host:port`; several IP addresses `10.0.0.1:50052,10.0.0.2:50052`; or a DNS
  name resolved to all its addresses, `dns:///locks.internal:50052`. Calls are spread
  over the addresses (round_robin).
- Retries: the methods in `retry` (whole services or `Service/Method`) are retried by
  gRPC itself on UNAVAILABLE, with backoff. Name only idempotent calls.
- Keepalive: a ping every 30 s on a connection with calls, so a dead peer behind a NAT
  or load balancer is noticed in ~40 s, not at the next TCP timeout.
- Security: a `ClientSecurity` (serentak.credentials): TLS files and the bearer token as
  call credentials. TLS to a list of addresses verifies the name set by
  `ClientSecurity.with_server_name` (`SERENTAK_LOCKS_TLS_SERVER_NAME`, ...), the name the
  replicas' certificates share: a list is no host name, so without one it is refused
  here. Without TLS, a channel carrying a token uses local credentials, which gRPC lets
  reach loopback only: a token never crosses a network in clear. With neither
  (a health probe) it is a plain insecure channel.

- Interceptors: every grpc.aio channel gets the ones a process installed with
  `use_interceptors` (a server process installs OpenTelemetry's when tracing is on);
  none by default, so the client itself needs nothing of the kind.

The services make their channels here too (services.common.channels maps their settings
onto `ClientSecurity`), so TLS and load balancing change in this one file.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from typing import Any

import grpc

from serentak.credentials import ClientSecurity
from serentak.errors import ConfigError

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
# What `use_interceptors` installed: every grpc.aio channel opened afterwards gets them.
_interceptors: tuple[grpc.aio.ClientInterceptor, ...] = ()


def use_interceptors(interceptors: Sequence[grpc.aio.ClientInterceptor]) -> None:
    """Give every grpc.aio channel opened from now on `interceptors` (empty: none), as a
    server process does with its tracing's; channels already open keep theirs."""
    global _interceptors
    _interceptors = tuple(interceptors)


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


def checked_target(address: str, security: ClientSecurity) -> str:
    """The gRPC target for `address` (`target`), refusing TLS to a list of addresses with
    no name to verify them by: a ConfigError at start-up, not a handshake failure later."""
    resolved = target(address)
    is_list = resolved.startswith(("ipv4:", "ipv6:")) and "," in resolved
    if is_list and security.tls is not None and not security.server_name:
        raise ConfigError(
            f"{address!r}: TLS to a list of addresses needs the name their certificates carry "
            "(e.g. locks.serentak.internal): set the service's TLS server name "
            "(SERENTAK_UPLOAD/LOCKS/NOTIFY_TLS_SERVER_NAME, or the SDK's tls_server_name "
            "arguments), or dial dns:///NAME:PORT"
        )
    return resolved


def open_channel(
    address: str,
    security: ClientSecurity,
    *,
    retry: Sequence[str] = (),
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """A grpc.aio channel to `address` (create it inside the event loop that uses it)."""
    resolved = checked_target(address, security)
    opts = channel_options(retry, [*security.options(), *options])
    # None rather than (): grpc.aio then builds its plain, interceptor-free call objects.
    interceptors = _interceptors or None
    if security.plaintext:
        return grpc.aio.insecure_channel(resolved, options=opts, interceptors=interceptors)
    return grpc.aio.secure_channel(
        resolved, security.credentials(), options=opts, interceptors=interceptors
    )


def open_sync_channel(
    address: str,
    security: ClientSecurity,
    *,
    retry: Sequence[str] = (),
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """A blocking channel, for command lines and health probes."""
    resolved = checked_target(address, security)
    opts = channel_options(retry, [*security.options(), *options])
    if security.plaintext:
        return grpc.insecure_channel(resolved, options=opts)
    return grpc.secure_channel(resolved, security.credentials(), options=opts)


__all__ = [
    "channel_options",
    "checked_target",
    "open_channel",
    "open_sync_channel",
    "service_config",
    "target",
    "use_interceptors",
]
