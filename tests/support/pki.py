"""Certificates made at test time (trustme): a CA, server and client certificates as files."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec


@dataclass(frozen=True)
class CertFiles:
    """A certificate and its key on disk."""

    cert: Path
    key: Path


class Pki:
    """One CA writing its certificates under `folder`."""

    def __init__(self, folder: Path, name: str = "ca") -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.authority = trustme.CA(organization_name=f"serentak-test-{name}")
        self.name = name
        self.ca = folder / f"{name}.pem"
        self.authority.cert_pem.write_to_path(str(self.ca))

    def issue(self, file_name: str, *names: str, common_name: str | None = None) -> CertFiles:
        """A leaf certificate for `names` (DNS names or IPs), written as two PEM files."""
        leaf = self.authority.issue_cert(*names, common_name=common_name)
        files = CertFiles(
            self.folder / f"{self.name}-{file_name}.pem",
            self.folder / f"{self.name}-{file_name}-key.pem",
        )
        leaf.private_key_pem.write_to_path(str(files.key))
        # Write the chain last: a reader that sees the new certificate sees the new key.
        files.cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        return files

    def issue_uri(self, file_name: str, uri: str) -> CertFiles:
        """A client certificate whose only name is a SAN URI (a SPIFFE id), which trustme
        cannot make: built with `cryptography`, signed by this CA."""
        ca_key = serialization.load_pem_private_key(self.authority.private_key_pem.bytes(), None)
        ca_cert = x509.load_pem_x509_certificate(self.authority.cert_pem.bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), critical=True
            )
            .add_extension(
                x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
            )
            .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
        )
        files = CertFiles(
            self.folder / f"{self.name}-{file_name}.pem",
            self.folder / f"{self.name}-{file_name}-key.pem",
        )
        files.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return files

    def server(self, file_name: str = "server") -> CertFiles:
        """A server certificate for 127.0.0.1 and localhost."""
        return self.issue(file_name, "127.0.0.1", "localhost")


def server_tls_settings(pki: Pki, server: CertFiles, mtls: bool) -> dict[str, object]:
    """Settings overrides for a TLS server (mTLS: clients need a certificate from `pki`)."""
    return {
        "tls_cert_file": server.cert,
        "tls_key_file": server.key,
        **({"tls_client_ca_file": pki.ca} if mtls else {}),
    }


def client_tls_settings(pki: Pki, client: CertFiles | None) -> dict[str, object]:
    """Settings overrides for a client trusting `pki` (presenting `client` if given)."""
    return {
        "tls_ca_file": pki.ca,
        **(
            {"tls_client_cert_file": client.cert, "tls_client_key_file": client.key}
            if client
            else {}
        ),
    }
