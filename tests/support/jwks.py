"""A real identity provider stand-in: RSA signing keys, a JWKS over HTTP (or HTTPS with a
test CA's certificate) on loopback, tokens.

The JWKS server is a plain `ThreadingHTTPServer` in a thread; `publish()` swaps the key
set it serves (rotation), `fetches` counts how often the service asked for it, and
`hold()` / `release()` keep fetches waiting (a slow provider, made deterministic:
`requested` is set once a fetch is waiting or served).
"""

from __future__ import annotations

import json
import ssl
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from support.pki import CertFiles

ISSUER = "https://idp.test"
AUDIENCE = "serentak"


@dataclass
class SigningKey:
    """One RSA key pair and its kid."""

    kid: str = field(default_factory=lambda: f"k-{uuid.uuid4().hex[:8]}")
    private: rsa.RSAPrivateKey = field(
        default_factory=lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )

    def jwk(self) -> dict[str, Any]:
        """The public half as a JWK."""
        data = json.loads(RSAAlgorithm.to_jwk(self.private.public_key()))
        return {**data, "kid": self.kid, "alg": "RS256", "use": "sig"}

    def public_pem(self) -> bytes:
        """The public key in PEM (what an HS256 confusion attack would use as secret)."""
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def sign(self, claims: dict[str, Any], kid: str | None = None) -> str:
        """An RS256 token with `kid` (default: this key's) in its header."""
        return jwt.encode(claims, self.private, algorithm="RS256", headers={"kid": kid or self.kid})


def claims(**overrides: Any) -> dict[str, Any]:
    """A valid user token's claims (alice of acme), with overrides; None removes a claim."""
    now = int(time.time())
    base: dict[str, Any] = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "alice",
        "tenant_id": "acme",
        "iat": now,
        "nbf": now,
        "exp": now + 300,
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


class JwksServer:
    """Serves the current key set at `url` until `close()`; with `tls` (a certificate for
    127.0.0.1, support/pki.py) over https, as an identity provider with a private CA."""

    def __init__(self, *keys: SigningKey, tls: CertFiles | None = None) -> None:
        self._body = b""
        self.fetches = 0
        self.requested = threading.Event()
        self._open = threading.Event()
        self._open.set()
        self.publish(*keys)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requested.set()
                outer._open.wait(timeout=120)
                outer.fetches += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(outer._body)))
                self.end_headers()
                self.wfile.write(outer._body)

            def setup(self) -> None:
                # The TLS handshake in this connection's thread, not in the accepting one.
                if isinstance(self.request, ssl.SSLSocket):
                    self.request.do_handshake()
                super().setup()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = _Server(("127.0.0.1", 0), Handler, tls)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        scheme = "https" if tls else "http"
        port = self._server.server_address[1]
        self.url = f"{scheme}://127.0.0.1:{port}/.well-known/jwks.json"

    def publish(self, *keys: SigningKey) -> None:
        """Serve exactly these keys from now on."""
        self._body = json.dumps({"keys": [k.jwk() for k in keys]}).encode()

    def hold(self) -> None:
        """Answer no fetch until `release()`."""
        self._open.clear()

    def release(self) -> None:
        """Answer the held fetches, and every later one at once."""
        self._open.set()

    def close(self) -> None:
        """Stop serving."""
        self._open.set()
        self._server.shutdown()
        self._server.server_close()


class _Server(ThreadingHTTPServer):
    """The HTTP server, wrapping each accepted connection in TLS when given a certificate;
    a client that refuses the certificate fails its own handshake, quietly."""

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], tls: CertFiles | None
    ) -> None:
        self._tls: ssl.SSLContext | None = None
        if tls is not None:
            self._tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._tls.load_cert_chain(tls.cert, tls.key)
        super().__init__(address, handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        if self._tls is None:
            return sock, address
        return self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ssl.SSLError):
            super().handle_error(request, client_address)


def settings_env(settings: dict[str, Any]) -> dict[str, str]:
    """Settings overrides as the `SERENTAK_*` environment of a service process."""
    return {
        f"SERENTAK_{name.upper()}": value if isinstance(value, str) else json.dumps(value)
        for name, value in settings.items()
    }


def jwt_settings(server: JwksServer, **overrides: Any) -> dict[str, Any]:
    """Settings overrides for jwt mode against `server` (upload/notify/ops clients mapped)."""
    return {
        "auth_mode": "jwt",
        "auth_jwks_url": server.url,
        "auth_jwt_issuer": ISSUER,
        "auth_jwt_audience": AUDIENCE,
        "auth_jwks_min_refresh_seconds": 0.0,
        # A loaded CI machine must not turn a slow loopback fetch into a failed test.
        "auth_jwks_timeout_seconds": 30.0,
        "auth_service_clients": {
            "serentak-upload": "upload",
            "serentak-notify": "notify",
            "serentak-ops": "ops",
        },
        **overrides,
    }
