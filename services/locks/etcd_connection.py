"""Channels to an etcd cluster: several members, TLS, auth tokens, keepalive, failover.

One gRPC channel per configured endpoint, built on etcd3aio's generated stubs. A channel
per member (rather than one round-robin channel over resolved IPs) keeps two things
right without extra settings: a DNS name (`etcd-0.etcd:2379`, as in Kubernetes) is
resolved by gRPC itself, again on every reconnect, and TLS verifies each member's
certificate against the name it was dialled by.

Every call goes to the current member. When it answers UNAVAILABLE (connection refused,
member stopped, "no leader", "leader changed"), the call moves to the next member and is
sent again until the caller's time budget runs out; only then does it become
`EtcdUnavailable`. Requests are re-sent only where that is harmless: the lock code's
transactions compare create revisions, so a repeated one finds its work already done.

With a username, the connection authenticates once and sends the token with every
call; when etcd says the token is no longer valid (it expired, or the member that knew
it restarted) it authenticates again and re-sends the call once.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from etcd3aio._protobuf import rpc_pb2, rpc_pb2_grpc

from services.common.config import CommonSettings
from services.common.logging import get_logger
from services.locks.errors import EtcdAuthFailed, EtcdPermissionDenied, EtcdUnavailable
from services.locks.metrics import ETCD_AUTHENTICATIONS, ETCD_FAILOVERS

log = get_logger(__name__)

T = TypeVar("T")

# etcd's own client asks members to cancel watches when they lose the leader, so a
# partitioned member cannot leave a waiter watching a stale copy.
REQUIRE_LEADER = ("hasleader", "true")

# Messages etcd sends with codes other than UNAVAILABLE that still mean "try again
# with a fresh token" (etcd 3.4/3.5 rpctypes).
_TOKEN_INVALID = (
    "invalid auth token",
    "revision of auth store is old",
    "user name is empty",
    "auth: token is expired",
)
_RETRY_BACKOFF_S = (0.05, 0.1, 0.2, 0.4)


@dataclass(frozen=True)
class EtcdOptions:
    """Where the cluster is and how to talk to it (from the `SERENTAK_ETCD_*` settings)."""

    endpoints: tuple[str, ...]
    call_timeout: float = 5.0
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    keepalive_seconds: float = 10.0
    prefer_first: bool = False  # start on the first endpoint, not a random one

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("at least one etcd endpoint is required")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("an etcd client certificate needs both a cert file and a key file")
        if self.cert_file is not None and self.ca_file is None:
            raise ValueError("an etcd client certificate needs the CA file too (TLS)")
        if self.username and self.password is None:
            raise ValueError("an etcd username needs a password")

    @property
    def tls(self) -> bool:
        """TLS is on when a CA is configured or an endpoint says https://."""
        return self.ca_file is not None or any(e.startswith("https://") for e in self.endpoints)


def options_from_settings(settings: CommonSettings, call_timeout: float) -> EtcdOptions:
    """The connection options the `SERENTAK_ETCD_*` settings describe."""
    password = settings.etcd_password.get_secret_value() if settings.etcd_password else None
    return EtcdOptions(
        endpoints=parse_endpoints(settings.etcd_endpoints or settings.etcd_endpoint),
        call_timeout=call_timeout,
        ca_file=settings.etcd_ca_file,
        cert_file=settings.etcd_cert_file,
        key_file=settings.etcd_key_file,
        username=settings.etcd_username,
        password=password,
        keepalive_seconds=settings.etcd_keepalive_seconds,
        prefer_first=settings.etcd_prefer_first_endpoint,
    )


def warn_if_exposed(options: EtcdOptions) -> None:
    """Log once when etcd is reached off this machine without TLS or without auth."""
    remote = [e for e in options.endpoints if not _is_loopback(_target(e))]
    if remote and not options.tls:
        log.warning("etcd_plaintext", endpoints=remote, hint="set SERENTAK_ETCD_CA_FILE")
    if remote and not options.username and options.cert_file is None:
        log.warning("etcd_unauthenticated", endpoints=remote, hint="set SERENTAK_ETCD_USERNAME")


def _is_loopback(target: str) -> bool:
    host = target.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a DNS name: assume it leaves the machine


def parse_endpoints(raw: str | Sequence[str]) -> tuple[str, ...]:
    """`a:2379,https://b:2379` -> ("a:2379", "https://b:2379"); blanks dropped."""
    items = raw.split(",") if isinstance(raw, str) else list(raw)
    return tuple(item.strip() for item in items if item.strip())


def _target(endpoint: str) -> str:
    """host:port for gRPC (a scheme, if any, only says whether TLS is on)."""
    for scheme in ("https://", "http://"):
        if endpoint.startswith(scheme):
            endpoint = endpoint[len(scheme) :]
    return endpoint.rstrip("/")


class _Member:
    """One endpoint: its channel and stubs, made on first use inside the event loop."""

    def __init__(self, endpoint: str, make_channel: Callable[[str], grpc.aio.Channel]) -> None:
        self.endpoint = endpoint
        self._make_channel = make_channel
        self.channel: grpc.aio.Channel | None = None

    def connect(self) -> grpc.aio.Channel:
        """The member's channel (gRPC connects in the background)."""
        if self.channel is None:
            self.channel = self._make_channel(_target(self.endpoint))
        return self.channel

    def healthy(self) -> bool:
        """False only when gRPC already knows the member cannot be reached."""
        if self.channel is None:
            return True
        state = self.channel.get_state(try_to_connect=True)
        return state != grpc.ChannelConnectivity.TRANSIENT_FAILURE


class EtcdConnection:
    """Calls into the cluster with failover and auth; see the module docstring."""

    def __init__(self, options: EtcdOptions) -> None:
        self.options = options
        self._credentials = self._channel_credentials() if options.tls else None
        self._members = [_Member(e, self._new_channel) for e in options.endpoints]
        # Start on a random member so that replicas spread over the cluster (unless
        # the operator prefers the first one, e.g. the member in the same zone).
        self._current = 0 if options.prefer_first else random.randrange(len(self._members))
        self._token: str | None = None
        self._auth_lock: asyncio.Lock | None = None
        self.authentications = 0  # tokens obtained so far (observable in tests)
        self._attempt_budget = max(1.0, options.call_timeout / 2)

    # -- channels -------------------------------------------------------------

    def _channel_credentials(self) -> grpc.ChannelCredentials:
        o = self.options
        return grpc.ssl_channel_credentials(
            root_certificates=o.ca_file.read_bytes() if o.ca_file else None,
            private_key=o.key_file.read_bytes() if o.key_file else None,
            certificate_chain=o.cert_file.read_bytes() if o.cert_file else None,
        )

    def _new_channel(self, target: str) -> grpc.aio.Channel:
        keepalive_ms = int(self.options.keepalive_seconds * 1000)
        options = [
            # Reconnect quickly to a member that comes back.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
            # Notice a silently dead member (no RST: power loss, partition) within
            # keepalive + timeout while a call or watch is open; etcd allows pings every
            # 5 s, and only during calls (it answers idle pings with GOAWAY), as its own
            # client does. An idle dead member shows at the next call, which fails over.
            ("grpc.keepalive_time_ms", keepalive_ms),
            ("grpc.keepalive_timeout_ms", max(1000, keepalive_ms // 2)),
            ("grpc.keepalive_permit_without_calls", 0),
            ("grpc.http2.max_pings_without_data", 0),
        ]
        if self._credentials is not None:
            return grpc.aio.secure_channel(target, self._credentials, options=options)
        return grpc.aio.insecure_channel(target, options=options)

    async def close(self) -> None:
        """Close every channel (pending calls fail)."""
        for member in self._members:
            if member.channel is not None:
                await member.channel.close()
                member.channel = None

    def pick(self) -> tuple[int, grpc.aio.Channel]:
        """The member to use now: the current one, unless gRPC knows it is down."""
        n = len(self._members)
        for step in range(n):
            index = (self._current + step) % n
            if self._members[index].healthy():
                self._current = index
                break
        return self._current, self._members[self._current].connect()

    @property
    def current_endpoint(self) -> str:
        """The member calls go to now."""
        return self._members[self._current].endpoint

    def failed(self, index: int) -> None:
        """The member at `index` did not serve a call: move on to the next one."""
        if self._current == index and len(self._members) > 1:
            self._current = (index + 1) % len(self._members)
            ETCD_FAILOVERS.inc()
            log.info(
                "etcd_failover",
                failed=self._members[index].endpoint,
                next=self._members[self._current].endpoint,
            )

    # -- auth -----------------------------------------------------------------

    async def metadata(self) -> tuple[tuple[str, str], ...]:
        """The auth token as call metadata (authenticating first if needed)."""
        if not self.options.username:
            return ()
        if self._token is None:
            await self._authenticate(None)
        # "" = etcd has auth switched off: send no token until it asks for one.
        return (("token", self._token),) if self._token else ()

    async def token_rejected(self, token_seen: tuple[tuple[str, str], ...]) -> None:
        """etcd refused the token sent in `token_seen`: get a new one (once per token)."""
        if not self.options.username:
            raise EtcdAuthFailed(
                "etcd requires authentication: set SERENTAK_ETCD_USERNAME and _PASSWORD"
            )
        await self._authenticate(token_seen[0][1] if token_seen else "")

    async def _authenticate(self, stale: str | None) -> None:
        if self._auth_lock is None:
            self._auth_lock = asyncio.Lock()
        async with self._auth_lock:
            if self._token is not None and self._token != stale:
                return  # someone else already refreshed it
            request = rpc_pb2.AuthenticateRequest(
                name=self.options.username, password=self.options.password or ""
            )
            try:
                resp = await self.unary(
                    lambda ch: rpc_pb2_grpc.AuthStub(ch).Authenticate,
                    request,
                    authenticated=False,
                )
            except grpc.aio.AioRpcError as exc:
                if "authentication is not enabled" in (exc.details() or ""):
                    # Credentials configured, auth off in etcd: work, but say so.
                    log.warning("etcd_auth_not_enabled", user=self.options.username)
                    self._token = ""
                    return
                raise EtcdAuthFailed(f"etcd refused the credentials: {exc.details()}") from exc
            self._token = resp.token
            self.authentications += 1
            ETCD_AUTHENTICATIONS.inc()
            log.info("etcd_authenticated", user=self.options.username)

    # -- calls ----------------------------------------------------------------

    async def unary(
        self,
        method: Callable[[grpc.aio.Channel], Callable[..., Any]],
        request: Any,
        time_budget: float | None = None,
        *,
        authenticated: bool = True,
    ) -> Any:
        """Send `request` with failover and token refresh within `time_budget` seconds.

        `method` picks the stub method off a channel. Raises EtcdUnavailable when no
        member answered in time; other etcd errors are raised as they are.
        """

        async def attempt(channel: grpc.aio.Channel, md: Any, budget: float) -> Any:
            return await method(channel)(request, timeout=budget, metadata=md)

        return await self.with_failover(attempt, time_budget, authenticated=authenticated)

    async def with_failover(
        self,
        attempt: Callable[[grpc.aio.Channel, Any, float], Any],
        time_budget: float | None = None,
        *,
        authenticated: bool = True,
    ) -> Any:
        """Run `attempt(channel, metadata, budget)` until one member serves it.

        The retry policy of every call: UNAVAILABLE moves to the next member; a rejected
        token is refreshed and the attempt re-sent once; time runs out -> EtcdUnavailable.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (time_budget or self.options.call_timeout)
        failures = 0
        refreshed = False
        last = "no attempt"
        while True:
            budget = deadline - loop.time()
            if budget <= 0:
                raise EtcdUnavailable(f"etcd: no member answered in time ({last})")
            index, channel = self.pick()
            md = await self.metadata() if authenticated else ()
            # With other members to try, one member gets a share of the budget: a
            # follower whose leader just died holds calls it forwards to the leader
            # until the election ends, and another member may answer sooner.
            share = budget if len(self._members) == 1 else min(budget, self._attempt_budget)
            try:
                return await attempt(channel, md or None, share)
            except grpc.aio.AioRpcError as exc:
                last = f"{exc.code().name}: {exc.details()}"
                if authenticated and not refreshed and token_invalid(exc):
                    refreshed = True
                    await self.token_rejected(md)
                    continue
                if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    if deadline - loop.time() <= 0:
                        raise EtcdUnavailable(f"etcd: {last}") from exc
                    self.failed(index)
                    continue
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    raise EtcdPermissionDenied(f"etcd: {last}") from exc
                if not retryable(exc):
                    raise
                self.failed(index)
                failures += 1
                if failures % len(self._members) == 0:
                    # Every member refused once: wait a little (leader election takes
                    # about a second), a retry timer and not a synchronisation point.
                    pause = _RETRY_BACKOFF_S[min(failures // len(self._members), 3) - 1]
                    await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))


def retryable(exc: grpc.aio.AioRpcError) -> bool:
    """Worth sending to another member: the member, not the request, was the problem.

    UNKNOWN is what etcd answers for errors it has no code for, in practice a follower
    failing to forward a lease request to a leader that just died. INTERNAL with
    "Internal error from Core" is made by our own gRPC core when a stream's connection
    breaks under a send (seen when a member is SIGKILLed mid keep-alive): no member
    ever answered, so it is the connection, not the request.
    """
    if exc.code() == grpc.StatusCode.INTERNAL:
        return (exc.details() or "") == _CORE_TRANSPORT_FAILURE
    return exc.code() in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
    )


_CORE_TRANSPORT_FAILURE = "Internal error from Core"


def token_invalid(exc: grpc.aio.AioRpcError) -> bool:
    """etcd refused the auth token (expired, unknown to a restarted member, or missing)."""
    details = exc.details() or ""
    return exc.code() in (
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.INVALID_ARGUMENT,
    ) and any(text in details for text in _TOKEN_INVALID)
