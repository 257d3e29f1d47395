"""The services' side of channel making: their settings mapped onto the client's types.

Every channel is built by the client package (`serentak.channels`: targets, retries,
keepalive, round_robin; `serentak.credentials`: TLS, call tokens), which a service uses as
any client does:

    channel = open_channel(settings.locks_address,
                           service_client_security(settings, LOCKS_CALLER, "locks"),
                           retry=["serentak.locks.v1.LockService/Release"])

What stays here is the mapping: `client_settings` reads the client-side fields of
`CommonSettings` (the same `SERENTAK_*` names), and `service_client_security` is a
service's credential for calling the others as its principal.
"""

from __future__ import annotations

from serentak.channels import checked_target
from serentak.credentials import ClientSecurity, settings_tls, settings_token
from serentak.settings import ClientSettings

from services.common.config import CommonSettings, ConfigError


def client_settings(settings: CommonSettings) -> ClientSettings:
    """The client's view of a service's settings (addresses, TLS files, its token)."""
    return ClientSettings(
        upload_address=settings.upload_address,
        locks_address=settings.locks_address,
        notify_address=settings.notify_address,
        auth_mode=settings.auth_mode,
        auth_service_tokens=dict(settings.auth_service_tokens),
        client_token=settings.client_token,
        client_token_file=settings.client_token_file,
        tls_ca_file=settings.tls_ca_file,
        tls_client_cert_file=settings.tls_client_cert_file,
        tls_client_key_file=settings.tls_client_key_file,
        upload_tls_server_name=settings.upload_tls_server_name,
        locks_tls_server_name=settings.locks_tls_server_name,
        notify_tls_server_name=settings.notify_tls_server_name,
    )


def service_client_security(
    settings: CommonSettings, principal: str, callee: str = ""
) -> ClientSecurity:
    """A service calling another (`callee`: upload, locks or notify) as `principal`: TLS,
    the name `callee`'s certificates carry, and the token, from its settings.

    In jwt mode a service with neither a token nor a client certificate could only call
    anonymously, which every service refuses: that is a start-up error, not a runtime one.
    """
    mapped = client_settings(settings)
    tls, token = settings_tls(mapped), settings_token(mapped, principal)
    if token is None and (tls is None or tls.cert_file is None):
        raise ConfigError(
            f"the {principal} service has no credential to call the others with: set "
            "SERENTAK_CLIENT_TOKEN_FILE (or SERENTAK_CLIENT_TOKEN), or a client certificate "
            "(SERENTAK_TLS_CLIENT_CERT_FILE/KEY_FILE) mapped by SERENTAK_AUTH_MTLS_PRINCIPALS"
        )
    security = ClientSecurity(tls=tls, token=token)
    if not callee:
        return security
    name_variable = f"SERENTAK_{callee.upper()}_TLS_SERVER_NAME"
    try:
        security = security.with_server_name(getattr(mapped, f"{callee}_tls_server_name"))
        checked_target(getattr(mapped, f"{callee}_address"), security)  # refused at start
    except ConfigError as exc:
        raise ConfigError(f"{name_variable}: {exc}") from exc
    return security


__all__ = ["client_settings", "service_client_security"]
