"""etcd connection settings: endpoint lists, TLS/auth pairs, refusal to start (unit)."""

from __future__ import annotations

import pytest

from services.locks.app import build_app
from services.locks.etcd_client import Etcd
from services.locks.etcd_connection import EtcdOptions, parse_endpoints, warn_if_exposed
from services.locks.settings import LocksSettings


def test_endpoint_lists_take_dns_names_ips_and_schemes() -> None:
    raw = " etcd-0.etcd:2379, https://10.0.0.2:2379 ,,[::1]:2379"
    assert parse_endpoints(raw) == ("etcd-0.etcd:2379", "https://10.0.0.2:2379", "[::1]:2379")
    settings = LocksSettings(etcd_endpoints="a:1,b:2", etcd_endpoint="ignored:3")
    app = build_app(settings)
    assert app.name == "locks"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"etcd_cert_file": "/c.pem"}, "both a cert file and a key file"),
        ({"etcd_cert_file": "/c.pem", "etcd_key_file": "/k.pem"}, "needs the CA file"),
        ({"etcd_username": "u"}, "needs a password"),
        ({"etcd_ca_file": "/no/such/ca.pem"}, "No such file"),
        ({"etcd_endpoints": " , "}, "at least one etcd endpoint"),
    ],
)
def test_inconsistent_etcd_settings_refuse_to_start(
    overrides: dict[str, object], message: str
) -> None:
    if overrides.get("etcd_endpoints"):
        overrides = {**overrides, "etcd_endpoint": ""}
    with pytest.raises(SystemExit) as caught:
        build_app(LocksSettings(**overrides))
    assert message in str(caught.value) and str(caught.value).startswith("locks: etcd settings")


def test_plaintext_or_anonymous_etcd_off_this_machine_is_logged(capsys) -> None:  # type: ignore[no-untyped-def]
    warn_if_exposed(EtcdOptions(("127.0.0.1:2379", "localhost:2379")))
    assert "etcd_plaintext" not in capsys.readouterr().out
    warn_if_exposed(EtcdOptions(("127.0.0.1:2379", "etcd-0.etcd:2379")))
    out = capsys.readouterr().out
    assert "etcd_plaintext" in out and "etcd_unauthenticated" in out


@pytest.mark.etcd
async def test_credentials_for_an_etcd_without_auth_still_work(etcd, capsys) -> None:  # type: ignore[no-untyped-def]
    options = EtcdOptions((etcd.endpoint,), username="someone", password="secret")
    client = Etcd(options)
    try:
        lease = await client.grant_lease(5)
        assert await client.keep_alive(lease) > 0
    finally:
        await client.close()
    assert "etcd_auth_not_enabled" in capsys.readouterr().out
