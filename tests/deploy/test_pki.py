"""deploy/pki/gen-pki.sh: certificates that chain to its CA with the names the services
dial, a JWKS whose key verifies the tokens it mints, private keys not world-readable."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

PKI_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "pki" / "gen-pki.sh"


def _b64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _openssl(*args: str) -> str:
    return subprocess.run(["openssl", *args], check=True, capture_output=True, text=True).stdout


def test_certificates_chain_to_the_ca_with_service_names(pki: Path) -> None:
    for name in ("etcd-1", "etcd-2", "etcd-3", "etcd-client", "upload", "locks", "notify"):
        assert f"{name}.pem: OK" in _openssl(
            "verify", "-CAfile", str(pki / "ca.pem"), str(pki / f"{name}.pem")
        )
    text = _openssl("x509", "-in", str(pki / "etcd-2.pem"), "-noout", "-text")
    assert "DNS:etcd-2" in text and "TLS Web Server Authentication" in text
    assert "TLS Web Client Authentication" in text  # peers authenticate each other
    text = _openssl("x509", "-in", str(pki / "locks.pem"), "-noout", "-text")
    assert "DNS:locks.serentak.svc.cluster.local" in text


def test_each_replica_certificate_carries_the_shared_service_name(tmp_path: Path) -> None:
    # A client dialling a list of replicas' IPs verifies SERVICE.serentak.internal
    # (SERENTAK_LOCKS_TLS_SERVER_NAME): every replica's certificate must carry it.
    shell = shutil.which("dash") or "sh"
    env = {"PATH": "/usr/bin:/bin", "REPLICAS": "1 2"}
    subprocess.run([shell, str(PKI_SCRIPT), str(tmp_path)], check=True, env=env)
    for service in ("upload", "locks", "notify"):
        for name in (service, f"{service}-1", f"{service}-2"):
            verified = _openssl(
                "verify",
                "-CAfile",
                str(tmp_path / "ca.pem"),
                "-verify_hostname",
                f"{service}.serentak.internal",
                str(tmp_path / f"{name}.pem"),
            )
            assert f"{name}.pem: OK" in verified
        own = _openssl("x509", "-in", str(tmp_path / f"{service}-2.pem"), "-noout", "-text")
        assert f"DNS:{service}-2.serentak.internal" in own
        assert f"DNS:{service}-1" not in own  # a replica names itself, not its peers
    mismatch = subprocess.run(
        [
            "openssl",
            "verify",
            "-CAfile",
            str(tmp_path / "ca.pem"),
            "-verify_hostname",
            "notify.serentak.internal",
            str(tmp_path / "locks-1.pem"),
        ],
        capture_output=True,
        text=True,
    )
    assert mismatch.returncode != 0  # locks' certificate cannot pass for notify


def test_private_keys_are_not_world_readable(pki: Path) -> None:
    assert sorted(p.name for p in (pki / "public").iterdir()) == ["ca.pem", "jwks.json"]
    for key in pki.glob("*-key.pem"):
        assert key.stat().st_mode & 0o077 == 0, key.name
    for token in (pki / "tokens").iterdir():
        assert token.stat().st_mode & 0o077 == 0, token.name


def test_jwks_verifies_the_minted_tokens(pki: Path) -> None:
    (key,) = json.loads((pki / "public" / "jwks.json").read_text())["keys"]
    modulus = _openssl("pkey", "-pubin", "-in", str(pki / "jwt-pub.pem"), "-noout", "-text")
    assert key["kty"] == "RSA" and key["alg"] == "RS256" and key["e"] == "AQAB"
    # openssl prints the modulus as colon-separated hex with a leading 00 byte.
    hex_digits = "".join(
        line.strip().replace(":", "")
        for line in modulus.split("Modulus:")[1].split("Exponent")[0].splitlines()
    )
    assert int(hex_digits, 16) == int.from_bytes(_b64url(key["n"]), "big")

    token = (pki / "tokens" / "alice.jwt").read_text().strip()
    header, payload, signature = token.split(".")
    assert json.loads(_b64url(header)) == {"alg": "RS256", "typ": "JWT", "kid": key["kid"]}
    claims = json.loads(_b64url(payload))
    assert (claims["sub"], claims["tenant_id"], claims["aud"]) == ("alice", "acme", "serentak")
    assert claims["exp"] > claims["iat"]
    (pki / "sig.bin").write_bytes(_b64url(signature))
    (pki / "signed.txt").write_text(f"{header}.{payload}")
    assert "Verified OK" in _openssl(
        "dgst",
        "-sha256",
        "-verify",
        str(pki / "jwt-pub.pem"),
        "-signature",
        str(pki / "sig.bin"),
        str(pki / "signed.txt"),
    )
    service = json.loads(_b64url((pki / "tokens" / "upload.jwt").read_text().split(".")[1]))
    assert service["client_id"] == "serentak-upload"


def test_a_token_for_a_new_user_verifies_with_the_same_jwks(pki: Path) -> None:
    shell = shutil.which("dash") or "sh"
    jwks_before = (pki / "public" / "jwks.json").read_text()
    subprocess.run(
        [shell, str(PKI_SCRIPT), str(pki), "user", "dora", "acme", "ops,auditor"],
        check=True,
        capture_output=True,
    )
    # No new key, no restart: the JWKS the services hold already verifies it.
    assert (pki / "public" / "jwks.json").read_text() == jwks_before
    (key,) = json.loads(jwks_before)["keys"]
    token = (pki / "tokens" / "dora.jwt").read_text().strip()
    header, payload, signature = token.split(".")
    assert json.loads(_b64url(header))["kid"] == key["kid"]
    claims = json.loads(_b64url(payload))
    assert (claims["sub"], claims["tenant_id"], claims["roles"]) == (
        "dora",
        "acme",
        ["ops", "auditor"],
    )
    assert (pki / "tokens" / "dora.jwt").stat().st_mode & 0o077 == 0
    (pki / "dora.sig").write_bytes(_b64url(signature))
    (pki / "dora.txt").write_text(f"{header}.{payload}")
    assert "Verified OK" in _openssl(
        "dgst", "-sha256", "-verify", str(pki / "jwt-pub.pem"),
        "-signature", str(pki / "dora.sig"), str(pki / "dora.txt"),
    )  # fmt: skip
    # A name that would break the claims' JSON is refused, and nothing is written.
    refused = subprocess.run(
        [shell, str(PKI_SCRIPT), str(pki), "user", 'x"y', "acme"], capture_output=True
    )
    assert refused.returncode != 0 and not (pki / "tokens" / 'x"y.jwt').exists()


def test_etcd_members_carry_the_address_they_are_dialled_at(tmp_path: Path) -> None:
    shell = shutil.which("dash") or "sh"
    env = {"PATH": "/usr/bin:/bin", "ETCD_MEMBERS": "etcd-1=10.0.1.1 etcd-2=db.example etcd-3"}
    subprocess.run([shell, str(PKI_SCRIPT), str(tmp_path)], check=True, env=env)
    for member, host in (("etcd-1", "10.0.1.1"), ("etcd-2", "db.example")):
        verified = _openssl(
            "verify", "-CAfile", str(tmp_path / "ca.pem"),
            "-verify_ip" if host[0].isdigit() else "-verify_hostname", host,
            str(tmp_path / f"{member}.pem"),
        )  # fmt: skip
        assert f"{member}.pem: OK" in verified
    assert sorted(p.name for p in (tmp_path / "by-service").iterdir())[:3] == [
        "etcd-1",
        "etcd-2",
        "etcd-3",
    ]
    # ECDSA P-256 keys (fast to make): what gRPC, etcd and OpenSSL all accept.
    assert "ASN1 OID: prime256v1" in _openssl(
        "pkey", "-in", str(tmp_path / "etcd-1-key.pem"), "-noout", "-text"
    )
