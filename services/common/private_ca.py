"""A private CA for the services' own HTTPS calls out (the S3 store, the JWKS): the PEM file
a `*_CA_FILE` setting names, trusted in addition to the system's roots.

The file is read once, at start: an unreadable file, or one holding no certificate, stops
the service with a ConfigError naming the variable. A CA is replaced rarely, and a new one
takes a restart (the certificates it signs may be renewed freely: only the CA is pinned).
"""

from __future__ import annotations

import ssl
from pathlib import Path

from services.common.config import ConfigError


def read_ca_file(path: Path, variable: str) -> bytes:
    """The PEM certificates in `path`, checked; ConfigError naming `variable` if the file
    cannot be read or holds no certificate."""
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{variable}: cannot read {path}: {exc.strerror or exc}") from exc
    try:
        https_context(pem)
    except (ValueError, ssl.SSLError) as exc:
        raise ConfigError(f"{variable}: {path} holds no PEM certificate ({exc})") from exc
    return pem


def https_context(pem: bytes) -> ssl.SSLContext:
    """A client context verifying servers against the system's roots and the CA
    certificates in `pem` (host names checked, TLS 1.2 or newer)."""
    context = ssl.create_default_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # PEM is ASCII: other bytes raise UnicodeDecodeError, a ValueError like "no certificate".
    context.load_verify_locations(cadata=pem.decode("ascii"))
    return context
