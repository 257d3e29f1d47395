"""Real etcd on 127.0.0.1: one member (`EtcdServer`) or a cluster (`EtcdCluster`).

The cluster runs over TLS with client certificates made at test time (trustme) and with
etcd auth enabled, as production does; reuse it for any test that needs failover.
"""

from __future__ import annotations

import functools
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc
from etcd3aio._protobuf import auth_pb2, rpc_pb2, rpc_pb2_grpc

from deploy.local.etcd import MemberTls, etcd_command, etcd_healthy
from deploy.local.etcd import find_etcd_binary as etcd_binary
from support.ports import free_port
from support.process import (
    START_TIMEOUT_S,
    LocalServer,
    kill_process,
    spawn,
    stop_process,
    wait_ready,
)

T = TypeVar("T")
Metadata = tuple[tuple[str, str], ...]


class EtcdServer(LocalServer):
    """One etcd member. `stop()` then `start()` keeps its data and port (a restart)."""

    name = "etcd"

    def __init__(self, data_dir: Path, binary: str | None = None) -> None:
        found = binary or etcd_binary()
        if found is None:
            raise RuntimeError("no etcd binary: set ETCD_BIN or install etcd-server")
        self.binary = found
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.log_path = data_dir.parent / f"{data_dir.name}.log"

    @property
    def endpoint(self) -> str:
        """host:port of the client URL."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def client_url(self) -> str:
        """The http:// client URL."""
        return f"http://127.0.0.1:{self.client_port}"

    def command(self) -> list[str]:
        """The etcd command line of this member."""
        peer = f"http://127.0.0.1:{self.peer_port}"
        return etcd_command(self.binary, "serentak-test", self.data_dir, self.client_url, peer)

    def ready(self) -> bool:
        """True once /health answers true."""
        return etcd_healthy(self.client_url)


@dataclass(frozen=True)
class ClusterCerts:
    """PEM files made at test time: the cluster's CA, a client pair, and a stranger's pair."""

    ca_file: Path
    cert_file: Path  # client certificate signed by the cluster's CA
    key_file: Path
    foreign_cert_file: Path  # a client certificate from another CA (must be refused)
    foreign_key_file: Path
    member: MemberTls  # what the members present (also valid as peer and client cert)


def make_certs(folder: Path) -> ClusterCerts:
    """A CA, a member certificate for 127.0.0.1/localhost, a client pair, a foreign pair."""
    import trustme

    folder.mkdir(parents=True, exist_ok=True)
    ca, stranger = trustme.CA(), trustme.CA()
    member = ca.issue_cert("127.0.0.1", "localhost", common_name="etcd-member")
    client = ca.issue_cert("serentak-locks", common_name="serentak-locks")
    foreign = stranger.issue_cert("serentak-locks", common_name="serentak-locks")
    paths = {
        name: folder / f"{name}.pem"
        for name in ("ca", "member", "member-key", "client", "client-key", "foreign", "foreign-key")
    }
    ca.cert_pem.write_to_path(str(paths["ca"]))
    for name, leaf in (("member", member), ("client", client), ("foreign", foreign)):
        leaf.private_key_pem.write_to_path(str(paths[f"{name}-key"]))
        paths[name].write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    return ClusterCerts(
        ca_file=paths["ca"],
        cert_file=paths["client"],
        key_file=paths["client-key"],
        foreign_cert_file=paths["foreign"],
        foreign_key_file=paths["foreign-key"],
        member=MemberTls(paths["ca"], paths["member"], paths["member-key"]),
    )


class EtcdCluster:
    """`n` etcd members on loopback, optionally over TLS (client certs) with auth on.

    With auth, the root user (`root_password`) administers, and `username`/`password`
    is an ordinary user whose role may read and write every key starting with "/".
    `leader()` names the current leader's index; `kill(i)` SIGKILLs a member and
    `start(i)` brings it back with its data.
    """

    username = "serentak"
    password = "serentak-etcd-password"
    root_password = "root-etcd-password"

    def __init__(self, folder: Path, n: int = 3, tls: bool = True, auth: bool = True) -> None:
        found = etcd_binary()
        if found is None:
            raise RuntimeError("no etcd binary: set ETCD_BIN or install etcd-server")
        self.binary = found
        self.folder = folder
        self.certs = make_certs(folder / "certs") if tls else None
        self.auth = auth
        scheme = "https" if tls else "http"
        self.ports = [(free_port(), free_port()) for _ in range(n)]
        self.names = [f"m{i}" for i in range(n)]
        self.client_urls = [f"{scheme}://127.0.0.1:{c}" for c, _ in self.ports]
        self.peer_urls = [f"{scheme}://127.0.0.1:{p}" for _, p in self.ports]
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * n

    @property
    def endpoints(self) -> list[str]:
        """host:port of every member's client URL (IP literals)."""
        return [f"127.0.0.1:{c}" for c, _ in self.ports]

    @property
    def ca_file(self) -> Path | None:
        return self.certs.ca_file if self.certs else None

    @property
    def cert_file(self) -> Path | None:
        return self.certs.cert_file if self.certs else None

    @property
    def key_file(self) -> Path | None:
        return self.certs.key_file if self.certs else None

    def settings(self) -> dict[str, object]:
        """Keyword overrides for a service's settings class pointing at this cluster."""
        values: dict[str, object] = {"etcd_endpoints": ",".join(self.endpoints)}
        if self.certs:
            values |= {
                "etcd_ca_file": self.ca_file,
                "etcd_cert_file": self.cert_file,
                "etcd_key_file": self.key_file,
            }
        if self.auth:
            values |= {"etcd_username": self.username, "etcd_password": self.password}
        return values

    def env(self) -> dict[str, str]:
        """The same as `SERENTAK_*` environment variables, for service processes."""
        return {f"SERENTAK_{k.upper()}": str(v) for k, v in self.settings().items()}

    # -- lifecycle ------------------------------------------------------------

    def _spawn(self, i: int) -> None:
        initial = ",".join(f"{n}={u}" for n, u in zip(self.names, self.peer_urls, strict=True))
        command = etcd_command(
            self.binary,
            self.names[i],
            self.folder / self.names[i],
            self.client_urls[i],
            self.peer_urls[i],
            initial_cluster=initial,
            tls=self.certs.member if self.certs else None,
        )
        self.processes[i] = spawn(command, self.folder / f"{self.names[i]}.log")

    def _wait_healthy(self, members: list[int]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        tls = self.certs.member if self.certs else None
        for i in members:
            wait_ready(
                self.processes[i],
                functools.partial(etcd_healthy, self.client_urls[i], tls),
                f"etcd member {i} exited",
                f"etcd member {i} did not become healthy: {self.folder}",
                self.folder / f"{self.names[i]}.log",
                timeout=max(0.0, deadline - time.monotonic()),
            )

    def start_all(self) -> None:
        """Start every member (they need each other for a quorum) and enable auth."""
        for i in range(len(self.names)):
            self._spawn(i)
        self._wait_healthy(list(range(len(self.names))))
        if self.auth:
            self._enable_auth()

    def start(self, i: int) -> None:
        """(Re)start member `i` with its data; returns once it is healthy."""
        if self.processes[i] is None:
            self._spawn(i)
        self._wait_healthy([i])

    def kill(self, i: int) -> None:
        """SIGKILL member `i`, as a crash."""
        process = self.processes[i]
        if process is not None:
            kill_process(process)
            self.processes[i] = None

    def pause(self, i: int) -> None:
        """SIGSTOP member `i`: it keeps its connections but answers nothing (a hang)."""
        process = self.processes[i]
        if process is not None:
            process.send_signal(signal.SIGSTOP)

    def resume(self, i: int) -> None:
        """SIGCONT a paused member."""
        process = self.processes[i]
        if process is not None:
            process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Stop every member."""
        for process in self.processes:
            if process is not None:
                process.send_signal(signal.SIGCONT)  # a paused member cannot exit
        for i, process in enumerate(self.processes):
            if process is not None:
                stop_process(process)
                self.processes[i] = None

    # -- admin (synchronous gRPC, for fixtures) -------------------------------

    def _channel(self, i: int) -> grpc.Channel:
        target = self.endpoints[i]
        if self.certs is None:
            return grpc.insecure_channel(target)
        creds = grpc.ssl_channel_credentials(
            self.certs.ca_file.read_bytes(),
            self.certs.key_file.read_bytes(),
            self.certs.cert_file.read_bytes(),
        )
        return grpc.secure_channel(target, creds)

    def _root_metadata(self, channel: grpc.Channel) -> Metadata:
        if not self.auth:
            return ()
        auth = rpc_pb2_grpc.AuthStub(channel)
        resp = auth.Authenticate(
            rpc_pb2.AuthenticateRequest(name="root", password=self.root_password), timeout=5
        )
        return (("token", resp.token),)

    def admin(self, fn: Callable[[grpc.Channel, tuple[tuple[str, str], ...]], T]) -> T:
        """Run `fn(channel, root_metadata)` against the first live member."""
        last: Exception | None = None
        for i, process in enumerate(self.processes):
            if process is None:
                continue
            with self._channel(i) as channel:
                try:
                    return fn(channel, self._root_metadata(channel))
                except grpc.RpcError as exc:
                    last = exc
        raise RuntimeError(f"no member answered: {last}")

    def _enable_auth(self) -> None:
        def enable(channel: grpc.Channel, _md: object) -> None:
            auth = rpc_pb2_grpc.AuthStub(channel)
            auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password=self.root_password))
            auth.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="root"))
            auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"))
            auth.UserAdd(rpc_pb2.AuthUserAddRequest(name=self.username, password=self.password))
            auth.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="locks"))
            perm = auth_pb2.Permission(
                permType=auth_pb2.Permission.READWRITE, key=b"/", range_end=b"0"
            )
            auth.RoleGrantPermission(
                rpc_pb2.AuthRoleGrantPermissionRequest(name="locks", perm=perm)
            )
            auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user=self.username, role="locks"))
            auth.AuthEnable(rpc_pb2.AuthEnableRequest())

        with self._channel(0) as channel:
            enable(channel, ())

    def statuses(self) -> dict[int, rpc_pb2.StatusResponse]:
        """Maintenance.Status of every live member, by index."""
        live = [i for i, process in enumerate(self.processes) if process is not None]
        return member_statuses(live, self._channel, self._root_metadata)

    def leader(self, within: float = START_TIMEOUT_S) -> int:
        """Index of the member that is leader now (waits for an election to finish)."""
        return wait_for_leader(self.statuses, within)


def member_statuses(
    members: list[int],
    channel: Callable[[int], grpc.Channel],
    metadata: Callable[[grpc.Channel], Metadata] = lambda _: (),
) -> dict[int, rpc_pb2.StatusResponse]:
    """Maintenance.Status of each member in `members` that answers, by index; `channel(i)`
    opens a channel to member i, `metadata(channel)` authenticates on it if need be."""
    out = {}
    for i in members:
        with channel(i) as ch:
            try:
                out[i] = rpc_pb2_grpc.MaintenanceStub(ch).Status(
                    rpc_pb2.StatusRequest(), timeout=2, metadata=metadata(ch)
                )
            except grpc.RpcError:
                continue
    return out


def wait_for_leader(
    statuses: Callable[[], dict[int, rpc_pb2.StatusResponse]], within: float = START_TIMEOUT_S
) -> int:
    """Index of the member that is leader now, by `statuses()` (waits for an election)."""
    deadline = time.monotonic() + within
    while True:
        for i, status in statuses().items():
            if status.leader and status.leader == status.header.member_id:
                return i
        if time.monotonic() > deadline:
            raise RuntimeError("no etcd leader elected")
        time.sleep(0.05)  # polling an observable condition (leadership), bounded
