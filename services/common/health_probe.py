"""`python -m services.common.health_probe [ADDRESS...] [--service readiness] [--wait S]`:
exit 0 if every ADDRESS reports SERVING.

The container HEALTHCHECK and the Kubernetes exec probe of a TLS deployment (the kubelet's
native gRPC probe speaks plaintext only), and an operator's start-up check
(docs/deploy-replicated.md): `--wait SECONDS` watches each server's status (Health/Watch,
waiting for it to listen) until it is SERVING or the time is up, instead of asking once.
With `SERENTAK_TLS_CA_FILE` set it dials TLS, with `SERENTAK_TLS_CLIENT_CERT_FILE`/`_KEY_FILE`
mutual TLS; `--server-name` is the name the server certificate carries when it does not
list the dialled address.
"""

from __future__ import annotations

import argparse
import sys
import time
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


def wait_serving(
    address: str,
    settings: ProbeSettings,
    server_name: str = "",
    wait: float = 60.0,
    service: str = "",
) -> str:
    """The status of `service` once it is SERVING, or the last one seen when `wait` seconds
    pass first (a server not yet listening is waited for, not failed)."""
    deadline = time.monotonic() + wait
    status = "UNKNOWN"
    with channel(address, settings, server_name) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            request = health_pb2.HealthCheckRequest(service=service)
            stream = stub.Watch(request, timeout=deadline - time.monotonic(), wait_for_ready=True)
            try:
                for update in stream:
                    status = health_pb2.HealthCheckResponse.ServingStatus.Name(update.status)
                    if update.status == health_pb2.HealthCheckResponse.SERVING:
                        return status
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:  # type: ignore[attr-defined]
                    break
                # The server went away (a restart): watch it again once it is back.
                status = exc.code().name  # type: ignore[attr-defined]
    return status


def main(argv: list[str] | None = None) -> int:
    """Print each address's status; exit 0 only when all are SERVING."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("addresses", nargs="*", default=["127.0.0.1:50051"], metavar="ADDRESS")
    parser.add_argument("--server-name", default="", help="TLS name to verify instead")
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--service", default="", help='"" (liveness) or "readiness"')
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to SECONDS (in all) for every address to report SERVING",
    )
    args = parser.parse_args(argv)
    settings = ProbeSettings()
    serving = True
    # One deadline for all: --wait bounds the whole check, however many addresses.
    deadline = time.monotonic() + args.wait
    for address in args.addresses:
        try:
            if args.wait > 0:
                left = max(0.1, deadline - time.monotonic())
                status = wait_serving(address, settings, args.server_name, left, args.service)
            else:
                status = probe(address, settings, args.server_name, args.timeout, args.service)
        except grpc.RpcError as exc:
            print(f"{address}: {exc.code().name}", file=sys.stderr)  # type: ignore[attr-defined]
            serving = False
            continue
        print(f"{address}: {status}")
        serving = serving and status == "SERVING"
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
