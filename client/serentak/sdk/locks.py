"""`LockClient`: how a program takes a lock, keeps it alive and learns that it is gone.

    locks = LockClient("127.0.0.1:50052", owner="upload-worker-7", security=as_upload)
    async with locks.hold("file:123", tenant_id="acme", ttl=30, wait_timeout=10) as lock:
        await commit_fenced(session, file_id, lock.token, ...)   # writes carry the token

This is the one lock-hold client: the upload service's merge takes its file locks with it
(services/upload/file_locks.py), and `SerentakClient.hold` is this client's `hold`.

Every call carries a credential (the lock service refuses anonymous callers): the
principal's call credentials in `security` (a `serentak.credentials.ClientSecurity`: its
token and TLS files), or a bearer `token` added to each call's metadata. A service
principal names the tenant whose key space holds the lock (`tenant_id`); a user principal
may leave it empty (its own tenant). `file:` keys are for the merge and operators; a user
locks in its own space, `user:{user_id}:{scope}`. Only the principal that acquired a lock
releases, refreshes or holds it.

`hold()` acquires (raising `LockHeld` when the wait runs out), opens a `Hold` stream so
the service renews the lease, and exposes `lock.token` for fencing.

When the lock is lost (lease expired, key deleted, etcd unreachable longer than the TTL,
or no renewal reached this client within its local deadline), the block is cancelled
where it stands (its task gets CancelledError at its next await), and the `async with`
raises `LockLost` instead of the cancellation, with `lost_reason` the Hold stream's
LostReason. A body that swallows CancelledError still ends in `LockLost` at the exit.
Writes the body made before the loss may still reach storage: the fencing token is what
makes a stale holder's commit fail. On every exit the lock is released (best effort: the
lease expires on its own once the Hold stream is closed).

When the lock service itself goes away (restart, network), the client re-attaches to
the same lock with `Hold(key, token)` as long as its local deadline has not passed: the
lease lives in etcd, not in the service, so a quick restart costs nothing. The local
deadline is the arrival of the last renewal plus the TTL minus a margin (10%, at least
0.2 s) for the renewal's own travel time; past it, the lock is treated as lost.

Errors are `serentak.errors` classes picked by the status's ErrorInfo reason (`LockHeld`,
`LockLost`, `SessionInFlightLimit`, `Unavailable`); another refusal is the call's
`grpc.aio.AioRpcError` (or `LockServiceError` when it came on the Session stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import TracebackType

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from serentak._compat import DeadlineExceeded, timeout, uncancel
from serentak._logging import get_logger
from serentak.channels import open_channel
from serentak.correlation import METADATA_KEY, current_correlation_id
from serentak.credentials import ClientSecurity
from serentak.errors import (
    LockHeld,
    LockLost,
    LockServiceError,
    SerentakError,
    SessionInFlightLimit,
    Unavailable,
)
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc
from serentak.sdk.lock_session import SessionBusy, SessionStream, SessionUnsupported

log = get_logger(__name__)

_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# How long leaving a hold waits for its watcher to stop before cutting the Hold stream.
_WATCH_STOP_S = 1.0
# Safe to resend on UNAVAILABLE: they act on a token, or only read.
_IDEMPOTENT = [
    "serentak.locks.v1.LockService/Release",
    "serentak.locks.v1.LockService/Describe",
    "serentak.locks.v1.LockService/List",
]

# Requests the session did not take (no Session, its in-flight limit): sent as unary calls.
_SEND_AS_A_CALL = (SessionUnsupported, SessionBusy, SessionInFlightLimit)


class LockClient:
    """A connection to the lock service for one owner (a worker, a process)."""

    def __init__(
        self,
        target: str | grpc.aio.Channel,
        owner: str,
        token: str | None = None,
        tenant_id: str = "",
        security: ClientSecurity | None = None,
    ) -> None:
        """`target` an address (see `serentak.channels.target`) or a channel; `security`
        the TLS files and principal call credentials (default: plaintext loopback, none)."""
        self._own_channel = isinstance(target, str)
        self.channel = (
            open_channel(
                target, security or ClientSecurity(), retry=_IDEMPOTENT, options=_CHANNEL_OPTIONS
            )
            if isinstance(target, str)
            else target
        )
        self.stub = locks_pb2_grpc.LockServiceStub(self.channel)
        self.owner = owner
        self.token = token
        self.tenant_id = tenant_id  # default tenant for calls that name none
        # Acquire and Release go as messages on one open Session stream (unary calls
        # when the service has no Session).
        self.session = SessionStream(self.stub, self._credential, typed_error)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata: correlation id and the bearer credential."""
        return ((METADATA_KEY, current_correlation_id()), *self._credential())

    def _credential(self) -> tuple[tuple[str, str], ...]:
        """The bearer credential, if any (a Session stream's metadata: its requests carry
        their own correlation ids)."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def tenant(self, tenant_id: str | None) -> str:
        """The tenant a call names: the argument, else this client's default."""
        return self.tenant_id if tenant_id is None else tenant_id

    async def close(self) -> None:
        """End the session stream; close the channel if this client opened it."""
        await self.session.close()
        if self._own_channel:
            await self.channel.close()

    def hold(
        self, key: str, ttl: int = 30, wait_timeout: float = 30.0, tenant_id: str | None = None
    ) -> HeldLock:
        """`async with` this to hold `key` for the block; see the module docstring."""
        return HeldLock(self, key, ttl, wait_timeout, self.tenant(tenant_id))

    async def acquire(
        self, key: str, ttl: int, wait_timeout: float, tenant_id: str | None = None
    ) -> locks_pb2.Lock:
        """Plain Acquire (no keepalive); raises LockHeld, or the call's typed error."""
        request = locks_pb2.AcquireRequest(
            key=key,
            owner=self.owner,
            ttl_seconds=ttl,
            wait_timeout_ms=int(wait_timeout * 1000),
            tenant_id=self.tenant(tenant_id),
        )
        with contextlib.suppress(*_SEND_AS_A_CALL):
            answer = await self.session.request(wait_timeout + 30, acquire=request)
            return answered(answer).lock
        try:
            lock: locks_pb2.Lock = await self.stub.Acquire(
                request, timeout=wait_timeout + 30, metadata=self.metadata()
            )
        except grpc.aio.AioRpcError as exc:
            raise typed_error(exc) from exc
        return lock

    async def release(self, key: str, token: int, tenant_id: str | None = None) -> bool:
        """Release if `token` is still the holder's; False when nothing changed."""
        request = locks_pb2.ReleaseRequest(key=key, token=token, tenant_id=self.tenant(tenant_id))
        # Release is idempotent: a session that broke under it is retried as a unary call
        # (which the channel's retry policy re-sends on UNAVAILABLE).
        with contextlib.suppress(*_SEND_AS_A_CALL, Unavailable):
            return answered(await self.session.request(10, release=request)).release.released
        try:
            resp = await self.stub.Release(request, timeout=10, metadata=self.metadata())
        except grpc.aio.AioRpcError as exc:
            raise typed_error(exc) from exc
        return bool(resp.released)

    async def describe(self, key: str, tenant_id: str | None = None) -> locks_pb2.DescribeResponse:
        """Holder and waiters of `key`."""
        request = locks_pb2.DescribeRequest(key=key, tenant_id=self.tenant(tenant_id))
        try:
            described: locks_pb2.DescribeResponse = await self.stub.Describe(
                request, timeout=10, metadata=self.metadata()
            )
        except grpc.aio.AioRpcError as exc:
            raise typed_error(exc) from exc
        return described


class HeldLock:
    """The `async with` of `LockClient.hold`; `token` is the fencing token."""

    def __init__(
        self, client: LockClient, key: str, ttl: int, wait_timeout: float, tenant_id: str
    ) -> None:
        self.client = client
        self.key = key
        self.tenant_id = tenant_id
        self.ttl = ttl
        self.wait_timeout = wait_timeout
        self.lock: locks_pb2.Lock | None = None
        self.lost: locks_pb2.Lost | None = None
        self.reattached = 0  # how many times the Hold stream was re-opened
        self._margin = max(0.2, ttl * 0.1)
        self._deadline = 0.0
        self._call: grpc.aio.StreamStreamCall | None = None
        self._watch: asyncio.Task[None] | None = None
        self._body: asyncio.Task[object] | None = None
        self._in_body = False
        self._cancelled_body = False

    @property
    def token(self) -> int:
        """The fencing token: carry it into every write made under this lock."""
        assert self.lock is not None, "not held"
        return self.lock.token

    async def __aenter__(self) -> HeldLock:
        self.lock = await self.client.acquire(self.key, self.ttl, self.wait_timeout, self.tenant_id)
        self._deadline = time.monotonic() + self.ttl - self._margin
        try:
            first = await self._open_hold(wait_for_ready=False)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.client.release(self.key, self.token, self.tenant_id)
            raise
        if first.HasField("lost"):
            with contextlib.suppress(Exception):
                await self.client.release(self.key, self.token, self.tenant_id)
            raise LockLost(first.lost.detail, key=self.key, token=self.token)
        self._body = asyncio.current_task()
        self._in_body = True
        self._watch = asyncio.create_task(self._watch_hold())
        # One turn of the loop: the watcher is reading the stream before the body runs. A
        # body shorter than that turn would otherwise end the hold with the stream never
        # read to its end, and a tracing interceptor (OpenTelemetry's ends the call's
        # span when the reading ends) would never end the Hold call's span.
        await asyncio.sleep(0)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._in_body = False  # from here on, a loss no longer cancels anything
        if self._watch is not None:
            self._watch.cancel()
            # Bounded: whatever the watcher is stuck in, the caller's transaction waits on us.
            await asyncio.wait({self._watch}, timeout=_WATCH_STOP_S)
            if not self._watch.done() and self._call is not None:
                self._call.cancel()  # its read() then ends, and so does the watcher
        try:
            await self.client.release(self.key, self.token, self.tenant_id)
        except SerentakError as err:
            # The lease expires on its own once the Hold stream is closed.
            log.info(
                "lock_release_failed", lock_key=self.key, lock_token=self.token, error=str(err)
            )
        finally:
            if self._call is not None:
                self._call.cancel()
        if self._cancelled_body:
            assert self._body is not None
            uncancel(self._body)
            lost = self.lost
            raise LockLost(
                f"lock {self.key} lost: {lost.detail if lost else 'unknown'}",
                key=self.key,
                token=self.token,
                lost_reason=locks_pb2.LostReason.Name(lost.reason) if lost else None,
            ) from exc
        return False

    async def _open_hold(self, wait_for_ready: bool) -> locks_pb2.HoldEvent:
        """Open a Hold stream for my key and token; returns its first event."""
        remaining = max(0.05, self._deadline - time.monotonic())
        call = self.client.stub.Hold(metadata=self.client.metadata(), wait_for_ready=wait_for_ready)
        self._call = call
        first = locks_pb2.HoldRequest(key=self.key, token=self.token, tenant_id=self.tenant_id)
        # asyncio.timeout (serentak._compat), not wait_for: on 3.11 wait_for swallows a
        # cancel that races the result, and the watcher would then renew forever after
        # __aexit__ cancels it.
        async with timeout(remaining):
            await call.write(first)
            event: locks_pb2.HoldEvent = await call.read()
        if event is grpc.aio.EOF:
            raise Unavailable("the lock service closed the Hold stream")
        self._note(event)
        return event

    def _note(self, event: locks_pb2.HoldEvent) -> None:
        if event.HasField("held"):
            self.lock = event.held
            self._deadline = time.monotonic() + event.held.ttl_seconds - self._margin

    async def _watch_hold(self) -> None:
        """Read Hold events until the lock is lost; re-attach if the stream breaks."""
        while True:
            try:
                assert self._call is not None
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    raise DeadlineExceeded
                async with timeout(remaining):
                    event = await self._call.read()
                if event is grpc.aio.EOF:
                    raise Unavailable("the lock service closed the Hold stream")
            except (grpc.aio.AioRpcError, Unavailable, DeadlineExceeded):
                event = await self._reattach()
            self._note(event)
            if event.HasField("lost"):
                self._on_lost(event.lost)
                return

    async def _reattach(self) -> locks_pb2.HoldEvent:
        """Re-open Hold with the same key and token until the local deadline passes."""
        while time.monotonic() < self._deadline:
            if self._call is not None:
                self._call.cancel()
            try:
                event = await self._open_hold(wait_for_ready=True)
            except (grpc.aio.AioRpcError, Unavailable, DeadlineExceeded):
                # A refused connection fails fast; pace the retries (retry timer).
                await asyncio.sleep(0.1)
                continue
            self.reattached += 1
            log.info("lock_hold_reattached", lock_key=self.key, lock_token=self.token)
            return event
        return locks_pb2.HoldEvent(
            lost=locks_pb2.Lost(
                reason=locks_pb2.LOST_REASON_ETCD_UNREACHABLE,
                detail="no renewal from the lock service within the TTL",
            )
        )

    def _on_lost(self, lost: locks_pb2.Lost) -> None:
        self.lost = lost
        log.warning(
            "lock_lost",
            lock_key=self.key,
            lock_token=self.token,
            reason=locks_pb2.LostReason.Name(lost.reason),
            detail=lost.detail,
        )
        if self._in_body and self._body is not None:
            self._cancelled_body = True
            self._body.cancel()


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def answered(response: locks_pb2.SessionResponse) -> locks_pb2.SessionResponse:
    """`response`, unless it is a session error: then that error, typed."""
    if not response.HasField("error"):
        return response
    error = response.error
    code = _CODES.get(error.code, grpc.StatusCode.UNKNOWN)
    raise known_error(code, error.message, error.reason, dict(error.metadata)) or LockServiceError(
        code, error.message, error.reason, **error.metadata
    )


def known_error(
    code: grpc.StatusCode, message: str, reason: str, metadata: dict[str, str]
) -> SerentakError | None:
    """The typed error callers of this client handle, if the status is one of them."""
    if reason == LockHeld.reason:
        return LockHeld(message, **metadata)
    if reason == LockLost.reason:
        return LockLost(message, **metadata)
    if reason == SessionInFlightLimit.reason:
        return SessionInFlightLimit(message, **metadata)
    if code == grpc.StatusCode.UNAVAILABLE:
        return Unavailable(message, reason=reason or "LOCK_SERVICE_UNAVAILABLE", **metadata)
    return None


def typed_error(exc: grpc.aio.AioRpcError) -> SerentakError | grpc.aio.AioRpcError:
    """The lock service's typed error for a failed call (by ErrorInfo reason)."""
    reason, metadata = "", {}
    status = rpc_status.from_call(exc)
    if status is not None:
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info):
                reason, metadata = info.reason, dict(info.metadata)
    return known_error(exc.code(), exc.details() or "", reason, metadata) or exc
