"""The client reads the `SERENTAK_*` variables it shares with the server as the server does:
same names (any case), same values, the dev ops token; the server maps its settings onto
the client's (services.common.channels.client_settings) to the same result."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from serentak.credentials import operator_security
from serentak.errors import ConfigError
from serentak.settings import ClientSettings

from services.common.channels import client_settings
from services.common.config import CommonSettings

ENV = {
    "SERENTAK_UPLOAD_ADDRESS": "10.0.0.1:1,10.0.0.2:1",
    "serentak_notify_address": "dns:///notify.internal:50053",
    "SERENTAK_AUTH_MODE": "jwt",
    "SERENTAK_AUTH_SERVICE_TOKENS": '{"tok-ops": "ops"}',
    "SERENTAK_CLIENT_TOKEN": "static-token",
    "SERENTAK_TLS_CA_FILE": "/etc/serentak/ca.pem",
    "SERENTAK_TLS_CLIENT_CERT_FILE": "/etc/serentak/c.pem",
    "SERENTAK_TLS_CLIENT_KEY_FILE": "/etc/serentak/c.key",
    "SERENTAK_LOCKS_TLS_SERVER_NAME": "locks.serentak.internal",
    "serentak_notify_tls_server_name": "notify.serentak.internal",
    "SERENTAK_SOMETHING_ELSE": "ignored",
}


def test_the_client_reads_the_shared_variables_as_the_server_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name.upper().startswith("SERENTAK_"):
            monkeypatch.delenv(name)
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    read = ClientSettings.from_environ()
    assert read == client_settings(CommonSettings())
    assert read.upload_address == "10.0.0.1:1,10.0.0.2:1"
    assert read.notify_address == "dns:///notify.internal:50053"
    assert read.locks_address == "127.0.0.1:50052"
    assert read.tls_ca_file == Path("/etc/serentak/ca.pem")
    assert read.locks_tls_server_name == "locks.serentak.internal"
    assert read.notify_tls_server_name == "notify.serentak.internal"
    assert read.upload_tls_server_name == ""
    assert dict(read.auth_service_tokens) == {"tok-ops": "ops"}


def test_defaults_and_the_dev_ops_token() -> None:
    dev = ClientSettings.from_environ({"SERENTAK_AUTH_MODE": "dev"})
    assert dev == client_settings(CommonSettings(auth_mode="dev"))
    security = operator_security(dev)
    assert security.token is not None and security.token.current() == "dev-ops"
    assert security.tls is None
    # A token on the command line wins; a certificate given there is the credential alone.
    assert operator_security(dev, token="t").token.current() == "t"  # type: ignore[union-attr]
    certified = operator_security(dev, cert_file="c.pem", key_file="c.key")
    assert certified.token is None and certified.tls is not None


@pytest.mark.parametrize(
    "environ",
    [
        {"SERENTAK_AUTH_MODE": "open"},
        {"SERENTAK_AUTH_SERVICE_TOKENS": "not json"},
        {"SERENTAK_AUTH_SERVICE_TOKENS": '["a"]'},
    ],
)
def test_settings_that_cannot_work_are_refused(environ: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        ClientSettings.from_environ(environ)


def test_no_credentials_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no credentials"):
        operator_security(ClientSettings.from_environ({"SERENTAK_AUTH_MODE": "jwt"}))
    with pytest.raises(ConfigError):
        operator_security(ClientSettings(), cert_file="c.pem")
