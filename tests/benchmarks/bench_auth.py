"""Cost of the trust boundary: identifying a caller, and a call over (m)TLS.

    .venv/bin/python tests/benchmarks/bench_auth.py [--quick]

Measures, in one run:
1. `Authenticator.require_user` for a dev token (the baseline: a table lookup) and for an
   RS256 JWT verified against keys from a JWKS served on loopback (cached keys);
2. a unary gRPC call (Health/Check) to an in-process server over plaintext (the baseline),
   TLS and mTLS, on a warm connection, through the channels module.
Prints µs per identify, p50/p99 per call, and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from serentak.channels import open_channel  # noqa: E402
from serentak.credentials import ClientSecurity, ClientTls  # noqa: E402
from support.jwks import JwksServer, SigningKey, claims, jwt_settings  # noqa: E402
from support.pki import Pki  # noqa: E402

from services.common.auth import Authenticator, build_authenticator  # noqa: E402
from services.common.config import CommonSettings  # noqa: E402
from services.common.grpc_server import ServiceApp, start  # noqa: E402
from services.common.logging import configure_logging  # noqa: E402
from services.common.security import ServerSecurity  # noqa: E402
from services.common.tls import ServerTls  # noqa: E402


class _Call:
    """The two things an authenticator reads from a call's context."""

    def __init__(self, token: str) -> None:
        self._md = (("authorization", f"Bearer {token}"),)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._md

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}


def identify_us(auth: Authenticator, call: _Call, n: int) -> float:
    """Mean µs per require_user over n calls."""
    started = time.perf_counter()
    for _ in range(n):
        auth.require_user(call)  # type: ignore[arg-type]
    return (time.perf_counter() - started) / n * 1e6


async def call_latencies(address: str, security: ClientSecurity, n: int) -> list[float]:
    """Health/Check round trips (ms) on one warm channel."""
    async with open_channel(address, security) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        await stub.Check(health_pb2.HealthCheckRequest())  # connect + handshake
        out = []
        for _ in range(n):
            t = time.perf_counter()
            await stub.Check(health_pb2.HealthCheckRequest())
            out.append((time.perf_counter() - t) * 1000)
        return out


async def main(quick: bool) -> None:
    configure_logging("bench", "console", "WARNING")
    n_identify, n_calls = (2_000, 300) if quick else (20_000, 3_000)
    key = SigningKey()
    idp = JwksServer(key)
    try:
        jwt_auth = build_authenticator(CommonSettings(**jwt_settings(idp)))
        jwt_call = _Call(key.sign(claims()))
        await jwt_auth.prepare(jwt_call)  # type: ignore[arg-type]
        dev_us = identify_us(Authenticator.dev(), _Call("dev-alice"), n_identify)
        jwt_us = identify_us(jwt_auth, jwt_call, n_identify)
    finally:
        idp.close()
    print(f"identify: dev {dev_us:.1f} µs, jwt RS256 {jwt_us:.1f} µs (x{jwt_us / dev_us:.0f})")

    with tempfile.TemporaryDirectory() as tmp:
        pki = Pki(Path(tmp))
        server, client = pki.server(), pki.issue("client", "upload.serentak.test")
        results = {}
        for name, server_tls, client_sec in (
            ("plaintext", None, ClientSecurity()),
            ("tls", ServerTls(server.cert, server.key), ClientSecurity(ClientTls(pki.ca))),
            (
                "mtls",
                ServerTls(server.cert, server.key, pki.ca),
                ClientSecurity(ClientTls(pki.ca, client.cert, client.key)),
            ),
        ):
            security = ServerSecurity("jwt", server_tls) if server_tls else None
            running = await start(ServiceApp("bench", "127.0.0.1", 0, 0, [], security=security))
            try:
                lat = await call_latencies(
                    f"127.0.0.1:{running.app.bound_port}", client_sec, n_calls
                )
            finally:
                await running.stop()
            qs = statistics.quantiles(lat, n=100)
            results[name] = qs[49]
            print(f"call {name}: p50 {qs[49]:.3f} ms, p99 {qs[98]:.3f} ms")
    base = results["plaintext"]
    print(f"ratios p50: tls x{results['tls'] / base:.2f}, mtls x{results['mtls'] / base:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    asyncio.run(main(parser.parse_args().quick))
