"""`SERENTAK_AUTH_MODE`: build the authenticator for `dev` or `jwt`, refuse anything else.

There is no default mode: a service whose settings name none refuses to start, so dev
tokens are never accepted by accident. `make run` and the test helpers say `dev`.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from urllib.parse import urlsplit

import jwt

from services.common.auth.authenticator import Authenticator
from services.common.auth.dev_tokens import DevTokens
from services.common.auth.jwt_tokens import ClaimsMapping, JwksKeys, JwtVerifier
from services.common.auth.peers import PeerPrincipals
from services.common.config import CommonSettings, ConfigError
from services.common.logging import get_logger
from services.common.private_ca import https_context, read_ca_file

log = get_logger(__name__)

NO_MODE_MESSAGE = (
    "SERENTAK_AUTH_MODE is not set: set it to `jwt` (with SERENTAK_AUTH_JWKS_URL, "
    "SERENTAK_AUTH_JWT_ISSUER, SERENTAK_AUTH_JWT_AUDIENCE) for real use, or to `dev` "
    "for fixed dev tokens on loopback (what `make run` does). See README 'Running it for real'."
)


def require_mode(settings: CommonSettings) -> str:
    """The configured auth mode; ConfigError when there is none."""
    if settings.auth_mode is None:
        raise ConfigError(NO_MODE_MESSAGE)
    return settings.auth_mode


def check_algorithms(algorithms: list[str]) -> list[str]:
    """The allow-list, refusing `none`, HMAC (a public key must never verify as a secret)
    and names PyJWT does not know."""
    if not algorithms:
        raise ConfigError("SERENTAK_AUTH_JWT_ALGORITHMS is empty")
    known = set(jwt.algorithms.get_default_algorithms())
    for alg in algorithms:
        if alg.lower() == "none" or alg.upper().startswith("HS"):
            raise ConfigError(f"SERENTAK_AUTH_JWT_ALGORITHMS may not contain {alg}")
        if alg not in known:
            raise ConfigError(f"SERENTAK_AUTH_JWT_ALGORITHMS: unknown algorithm {alg}")
    return list(algorithms)


def build_authenticator(settings: CommonSettings) -> Authenticator:
    """The authenticator the settings describe; ConfigError if they are incomplete."""
    peers = PeerPrincipals(settings.auth_mtls_principals)
    if require_mode(settings) == "dev":
        return Authenticator(DevTokens(settings.auth_tokens, settings.auth_service_tokens), peers)
    missing = [
        name
        for name, value in (
            ("SERENTAK_AUTH_JWKS_URL", settings.auth_jwks_url),
            ("SERENTAK_AUTH_JWT_ISSUER", settings.auth_jwt_issuer),
            ("SERENTAK_AUTH_JWT_AUDIENCE", settings.auth_jwt_audience),
        )
        if not value
    ]
    if missing:
        raise ConfigError(f"SERENTAK_AUTH_MODE=jwt needs {', '.join(missing)}")
    assert settings.auth_jwks_url and settings.auth_jwt_issuer and settings.auth_jwt_audience
    jwks = urlsplit(settings.auth_jwks_url)
    if jwks.scheme != "https" and not is_loopback(jwks.hostname or ""):
        # Whoever can answer this fetch can mint tokens: say so loudly (the compose demo
        # serves its JWKS over plain HTTP on a private network).
        log.warning("jwks_url_not_https", url=settings.auth_jwks_url)
    keys = JwksKeys(
        settings.auth_jwks_url,
        cache_seconds=settings.auth_jwks_cache_seconds,
        min_refresh_seconds=settings.auth_jwks_min_refresh_seconds,
        timeout_seconds=settings.auth_jwks_timeout_seconds,
        ssl_context=jwks_ssl_context(settings),
    )
    verifier = JwtVerifier(
        keys,
        issuer=settings.auth_jwt_issuer,
        audience=settings.auth_jwt_audience,
        algorithms=check_algorithms(settings.auth_jwt_algorithms),
        leeway_seconds=settings.auth_jwt_leeway_seconds,
        claims=ClaimsMapping(
            tenant=settings.auth_claim_tenant,
            user=settings.auth_claim_user,
            roles=settings.auth_claim_roles,
            client=settings.auth_claim_client,
            service_clients=tuple(settings.auth_service_clients.items()),
        ),
    )
    return Authenticator(verifier, peers)


def jwks_ssl_context(settings: CommonSettings) -> ssl.SSLContext | None:
    """The context trusting `SERENTAK_AUTH_JWKS_CA_FILE` (read now), None without one;
    ConfigError if it cannot be read or the JWKS URL is not https (it would protect nothing)."""
    if settings.auth_jwks_ca_file is None:
        return None
    if urlsplit(settings.auth_jwks_url or "").scheme != "https":
        raise ConfigError(
            "SERENTAK_AUTH_JWKS_CA_FILE is set but SERENTAK_AUTH_JWKS_URL is not https://: "
            f"{settings.auth_jwks_url}"
        )
    pem = read_ca_file(settings.auth_jwks_ca_file, "SERENTAK_AUTH_JWKS_CA_FILE")
    return https_context(pem)


def is_loopback(host: str) -> bool:
    """True when `host` only reaches this machine (127.0.0.0/8, ::1, localhost)."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def check_bind(mode: str | None, host: str) -> None:
    """dev mode (and apps declaring no security) may only listen on loopback."""
    if mode != "jwt" and not is_loopback(host):
        raise ConfigError(
            f"refusing to listen on {host} in dev mode: dev tokens are public. "
            "Use SERENTAK_AUTH_MODE=jwt off loopback, or SERENTAK_BIND_HOST=127.0.0.1."
        )
