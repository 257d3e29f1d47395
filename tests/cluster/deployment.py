"""The replicated deployment of docs/deploy-replicated.md, brought up on this machine by
following the guide's own blocks (support/guide.py): every process on a loopback address of
its own (127.0.1.N etcd, 127.0.2.N locks, 127.0.3.N notify, 127.0.4.N upload), with the
same ports on every "host" as in production, PostgreSQL and an S3 store (s3s-fs behind a TLS
terminator, its certificate from a private CA of the test's own) given to the inventory like
an operator's. The test's clients then read what they need from the files the guide
rendered (client.env, upload-1.env), not from settings of their own.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from etcd3aio._protobuf import rpc_pb2, rpc_pb2_grpc
from serentak.credentials import ClientSecurity, ClientTls
from sqlalchemy.engine import make_url
from support.etcd import member_statuses, wait_for_leader
from support.guide import Guide, GuideProcess
from support.pki import Pki
from support.ports import free_port
from support.postgres import PostgresDatabases
from support.s3 import S3Server
from support.services import REPO_ROOT
from support.tls_proxy import TlsProxy

GUIDE = REPO_ROOT / "docs" / "deploy-replicated.md"
PORTS = [
    "ETCD_CLIENT_PORT",
    "ETCD_PEER_PORT",
    "ETCD_METRICS_PORT",
    *(f"{s}_{p}" for s in ("LOCKS", "NOTIFY", "UPLOAD") for p in ("PORT", "METRICS_PORT")),
    *(f"{s}_HEALTH_PORT" for s in ("LOCKS", "NOTIFY", "UPLOAD")),
    "UPLOAD_WEBHOOK_PORT",
    "JWKS_PORT",
]


def inventory(
    folder: Path, postgres: PostgresDatabases, s3: S3Server, s3_tls: TlsProxy, s3_ca: Path, tag: str
) -> dict[str, str]:
    """This machine's answers to the guide's inventory: loopback hosts, free ports, the
    test PostgreSQL (TLS required; its certificate is not one a CA we hold signed, so no
    verify-full) and the s3s-fs store over https through `s3_tls`, trusted by `s3_ca`
    (s3s-fs has no TLS; the CA is the store's own, not the guide's PKI)."""
    admin = make_url(postgres.admin_dsn)
    values = {
        "DIR": str(folder),
        "PG_ADMIN_URL": postgres.admin_dsn,
        "PG_HOST": admin.host or "127.0.0.1",
        "PG_PORT": str(admin.port or 5432),
        "PG_TLS": "sslmode=require",
        "DB_OWNER": f"serentak_{tag}",
        "DB_PREFIX": f"serentak_{tag}",
        "ETCD_HOSTS": "127.0.1.1 127.0.1.2 127.0.1.3",
        "LOCKS_HOSTS": "127.0.2.1 127.0.2.2",
        "NOTIFY_HOSTS": "127.0.3.1 127.0.3.2",
        "UPLOAD_HOSTS": "127.0.4.1 127.0.4.2",
        "S3_ENDPOINT": s3_tls.endpoint,
        "S3_ALLOW_HTTP": "false",
        "S3_CA_FILE": str(s3_ca),
        "S3_BUCKET": s3.bucket,
        "S3_ACCESS_KEY_ID": s3.access_key,
        "S3_SECRET_ACCESS_KEY": s3.secret_key,
    }
    return values | {name: str(free_port()) for name in PORTS}


@dataclass
class Deployment:
    """The running deployment, as the guide left it."""

    guide: Guide
    client: dict[str, str]  # etc/client.env
    upload: dict[str, str]  # etc/upload-1.env

    @property
    def pki(self) -> Path:
        return Path(self.guide.env["DIR"]) / "pki"

    def token(self, name: str) -> str:
        """A token the guide's PKI minted (a user's, or a service's: `upload`)."""
        return (self.pki / "tokens" / f"{name}.jwt").read_text().strip()

    def addresses(self, service: str) -> list[str]:
        """Each replica of `service` ("upload", "notify", "locks"), from the list its
        callers are given."""
        listed = self.client if service != "locks" else self.upload
        return listed[f"SERENTAK_{service.upper()}_ADDRESS"].split(",")

    def user_security(self, service: str) -> ClientSecurity:
        """A user's device: trusts the CA, verifies the service's shared name."""
        name = self.client[f"SERENTAK_{service.upper()}_TLS_SERVER_NAME"]
        return ClientSecurity(
            tls=ClientTls(Path(self.client["SERENTAK_TLS_CA_FILE"]), server_name=name)
        )

    def service_security(self) -> ClientSecurity:
        """Another service holding locks: upload's certificate (locks wants one)."""
        tls = ClientTls(
            Path(self.upload["SERENTAK_TLS_CA_FILE"]),
            self.pki / "upload.pem",
            self.pki / "upload-key.pem",
            server_name=self.upload["SERENTAK_LOCKS_TLS_SERVER_NAME"],
        )
        return ClientSecurity(tls=tls)

    def process(self, name: str, n: int) -> GuideProcess:
        """Replica (or member) `n` (1-based) of `name`."""
        return self.guide.processes[name][n - 1]

    def restart(self, *procs: GuideProcess) -> None:
        """Start `procs` again from their blocks, then pass each one's check."""
        for proc in procs:
            self.guide.restart(proc)
        for check in {id(c): c for c in (self.guide.checks[p.name] for p in procs)}.values():
            self.guide.check(check)

    def _etcd_channel(self, i: int, as_: str = "etcd-1") -> grpc.Channel:
        """A channel to etcd member `i` (0-based), presenting `as_`'s certificate."""
        credentials = grpc.ssl_channel_credentials(
            (self.pki / "ca.pem").read_bytes(),
            (self.pki / f"{as_}-key.pem").read_bytes(),
            (self.pki / f"{as_}.pem").read_bytes(),
        )
        host = self.guide.hosts("etcd")[i]
        return grpc.secure_channel(f"{host}:{self.guide.env['ETCD_CLIENT_PORT']}", credentials)

    def etcd_leader(self) -> int:
        """The member (1-based) that leads now."""
        live = [p.n - 1 for p in self.guide.processes["etcd"] if p.process is not None]
        return wait_for_leader(lambda: member_statuses(live, self._etcd_channel)) + 1

    def etcd_refuses(self, key: bytes, as_: str) -> bool:
        """True when etcd answers PERMISSION_DENIED to `as_` writing `key`."""
        with self._etcd_channel(0, as_) as channel:
            try:
                rpc_pb2_grpc.KVStub(channel).Put(rpc_pb2.PutRequest(key=key, value=b"x"), timeout=5)
            except grpc.RpcError as exc:
                return exc.code() == grpc.StatusCode.PERMISSION_DENIED
        return False


@contextlib.contextmanager
def deployed(folder: Path, postgres: PostgresDatabases, s3: S3Server) -> Iterator[Deployment]:
    """Follow the guide from nothing; stop every process and drop its databases after."""
    tag = uuid.uuid4().hex[:8]
    store_ca = Pki(folder / "s3-pki", "s3-ca")
    with TlsProxy("127.0.0.1", s3.port, store_ca.server("s3")) as s3_tls:
        values = inventory(folder / "srv", postgres, s3, s3_tls, store_ca.ca, tag)
        (folder / "logs").mkdir(parents=True)
        guide = Guide(GUIDE, folder / "logs")
        try:
            guide.follow(values)
            yield Deployment(
                guide,
                guide.read_env_file("etc/client.env"),
                guide.read_env_file("etc/upload-1.env"),
            )
        finally:
            guide.stop_all()
            prefix = values["DB_PREFIX"]
            postgres.drop(f"{prefix}_upload", f"{prefix}_notify", role=values["DB_OWNER"])
