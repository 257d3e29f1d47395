"""The image's HEALTHCHECK command: exit 0 only while the server reports SERVING."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from support.ports import free_port

from services.common.health_probe import ProbeSettings, main, probe


@pytest.fixture
def health_server() -> Iterator[tuple[str, health.HealthServicer]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(None)


def test_serving_exits_zero_not_serving_exits_one(health_server, capsys) -> None:
    address, servicer = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert main([address]) == 0
    assert "SERVING" in capsys.readouterr().out
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert main([address]) == 1
    assert "NOT_SERVING" in capsys.readouterr().out


def test_nothing_listening_exits_one(capsys) -> None:
    assert main([f"127.0.0.1:{free_port()}", "--timeout", "1"]) == 1
    err = capsys.readouterr().err
    assert "UNAVAILABLE" in err or "DEADLINE_EXCEEDED" in err


@pytest.fixture
def mtls_health_server(pki) -> Iterator[str]:
    """A health server with the PKI's `upload` certificate, requiring client certificates."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    credentials = grpc.ssl_server_credentials(
        [((pki / "upload-key.pem").read_bytes(), (pki / "upload.pem").read_bytes())],
        root_certificates=(pki / "ca.pem").read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def test_probe_speaks_mutual_tls_with_the_compose_pki(mtls_health_server, pki, capsys) -> None:
    # What compose's healthcheck runs: the service's own client certificate, 127.0.0.1 in SAN.
    settings = ProbeSettings(
        tls_ca_file=pki / "ca.pem",
        tls_client_cert_file=pki / "locks.pem",
        tls_client_key_file=pki / "locks-key.pem",
    )
    assert probe(mtls_health_server, settings) == "SERVING"
    # Without a client certificate the server refuses the handshake.
    with pytest.raises(grpc.RpcError) as refused:
        probe(mtls_health_server, ProbeSettings(tls_ca_file=pki / "ca.pem"), timeout=3)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    # Plaintext against a TLS port fails too, and the exit status says so.
    assert main([mtls_health_server, "--timeout", "2"]) == 1


def test_readiness_is_probed_separately_from_liveness(health_server) -> None:
    address, servicer = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    servicer.set("readiness", health_pb2.HealthCheckResponse.NOT_SERVING)  # a dependency down
    assert main([address]) == 0
    assert main([address, "--service", "readiness"]) == 1
    servicer.set("readiness", health_pb2.HealthCheckResponse.SERVING)
    assert main([address, "--service", "readiness"]) == 0


def test_every_address_must_serve(health_server, capsys) -> None:
    address, servicer = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert main([address, address]) == 0
    assert main([address, f"127.0.0.1:{free_port()}", "--timeout", "1"]) == 1
    out = capsys.readouterr()
    assert f"{address}: SERVING" in out.out and "UNAVAILABLE" in out.err


def test_wait_watches_until_serving_and_waits_for_a_server_to_listen() -> None:
    port = free_port()
    answered: list[int] = []
    # Nothing listens yet: the probe waits for the server instead of failing.
    waiting = threading.Thread(
        target=lambda: answered.append(
            main([f"127.0.0.1:{port}", "--service", "readiness", "--wait", "60"])
        )
    )
    waiting.start()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set("readiness", health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        # Not ready yet: a short wait ends with the status it saw.
        assert main([f"127.0.0.1:{port}", "--service", "readiness", "--wait", "0.5"]) == 1
        servicer.set("readiness", health_pb2.HealthCheckResponse.SERVING)
        waiting.join(timeout=60)
        assert answered == [0]
    finally:
        server.stop(None)
