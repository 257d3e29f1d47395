"""`python -m services.common.health_probe [ADDRESS] [--service readiness]`: exit 0 if SERVING.

The container HEALTHCHECK and the Kubernetes exec probe of a TLS deployment (the kubelet's
native gRPC probe speaks plaintext only). With `SERENTAK_TLS_CA_FILE` set it dials TLS, with
`SERENTAK_TLS_CLIENT_CERT_FILE`/`_KEY_FILE` mutual TLS; `--server-name` is the name the
server certificate carries when it does not list the dialled address.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic_settings import BaseSettings, SettingsConfigDict
from serentak.channels import open_sync_channel
from serentak.credentials import ClientSecurity, ClientTls


class ProbeSettings(BaseSettings):
    """The client TLS files, by their shared names (all optional)."""

    model_config = SettingsConfigDict(env_prefix="SERENTAK_", frozen=True, extra="ignore")

    tls_ca_file: Path | None = None
    tls_client_cert_file: Path | None = None
    tls_client_key_file: Path | None = None


def channel(address: str, settings: ProbeSettings, server_name: str = "") -> grpc.Channel:
    """A plaintext channel, or a TLS one when a CA file is configured (serentak.channels)."""
    if settings.tls_ca_file is None:
        return open_sync_channel(address, ClientSecurity())
    tls = ClientTls(
        settings.tls_ca_file,
        settings.tls_client_cert_file,
        settings.tls_client_key_file,
        server_name=server_name,
    )
    return open_sync_channel(address, ClientSecurity(tls=tls))


def probe(
    address: str,
    settings: ProbeSettings,
    server_name: str = "",
    timeout: float = 3.0,
    service: str = "",
) -> str:
    """The status of health name `service` ("": liveness; "readiness": dependencies up)."""
    with channel(address, settings, server_name) as ch:
        response = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout
        )
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def main(argv: list[str] | None = None) -> int:
    """Print the status; exit 0 only for SERVING."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", nargs="?", default="127.0.0.1:50051")
    parser.add_argument("--server-name", default="", help="TLS name to verify instead")
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--service", default="", help='"" (liveness) or "readiness"')
    args = parser.parse_args(argv)
    try:
        status = probe(args.address, ProbeSettings(), args.server_name, args.timeout, args.service)
    except grpc.RpcError as exc:
        print(f"{args.address}: {exc.code().name}", file=sys.stderr)  # type: ignore[attr-defined]
        return 1
    print(f"{args.address}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
