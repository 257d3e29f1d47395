"""The lock client's `Session` stream: many lock requests over one open stream.

`LockClient` sends Acquire, Refresh and Release through one `SessionStream` (a message on an
open stream costs a fraction of a new call). The stream opens on first use with the
client's credential and reopens on the next request after it breaks. A request that gets no
answer in time cuts the stream (the server then abandons the session's unanswered
Acquires) and fails with `Unavailable`, like a request whose stream broke. A server without
`Session` (an older release) answers UNIMPLEMENTED: `unsupported` is then set and the client
goes back to the unary RPCs, as it does for a request past the session's in-flight limit
(`SessionBusy`; queueing it could hold a Release back behind Acquires that wait for it).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import grpc

from serentak._compat import DeadlineExceeded, timeout
from serentak.correlation import current_correlation_id
from serentak.errors import Unavailable
from serentak.locks.v1 import locks_pb2, locks_pb2_grpc

Metadata = tuple[tuple[str, str], ...]


class SessionUnsupported(Exception):
    """The lock service has no `Session` RPC (it answered UNIMPLEMENTED)."""


class SessionBusy(Exception):
    """The session already has its limit of requests in flight: send this one as a call."""


class _Stream:
    """One opened `Session` call and the requests waiting on it."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self.call = call
        self.pending: dict[int, asyncio.Future[locks_pb2.SessionResponse]] = {}
        self.reader: asyncio.Task[None] | None = None
        self.broken = False

    def fail(self, failure: BaseException) -> None:
        """Mark the stream broken and fail every request still waiting on it."""
        self.broken = True
        for answer in self.pending.values():
            if not answer.done():
                answer.set_exception(failure)


class SessionStream:
    """`Session` streams shared by concurrent requests, answers matched by id; a new stream
    is opened for the next request once one breaks."""

    def __init__(
        self,
        stub: locks_pb2_grpc.LockServiceStub,
        metadata: Callable[[], Metadata],
        stream_error: Callable[[grpc.aio.AioRpcError], BaseException],
    ) -> None:
        """`metadata()` is the stream's call metadata (its credential); `stream_error`
        turns the stream's failure into what each waiting request raises."""
        self._stub = stub
        self._metadata = metadata
        self._stream_error = stream_error
        self._stream: _Stream | None = None
        self._ids = itertools.count(1)
        self._write_lock = asyncio.Lock()  # grpc.aio sends one message at a time
        self.unsupported = False
        # Below the service's default limit (64), so a busy client is not refused.
        self.max_in_flight = 32

    async def request(self, answer_within: float, **op: object) -> locks_pb2.SessionResponse:
        """Send one request (`acquire=`, `refresh=` or `release=`) and await its answer."""
        if self.unsupported:
            raise SessionUnsupported
        stream = self._open()
        if len(stream.pending) >= self.max_in_flight:
            # Queueing here could hold a Release back behind Acquires waiting on it.
            raise SessionBusy
        request_id = next(self._ids)
        answer = asyncio.get_running_loop().create_future()
        stream.pending[request_id] = answer
        request = locks_pb2.SessionRequest(
            id=request_id,
            correlation_id=current_correlation_id(),
            **op,  # type: ignore[arg-type]
        )
        try:
            async with timeout(answer_within):
                async with self._write_lock:
                    await stream.call.write(request)
                response: locks_pb2.SessionResponse = await answer
                return response
        except DeadlineExceeded:
            failure = Unavailable(
                "no answer from the lock service in time", reason="LOCK_SERVICE_UNAVAILABLE"
            )
            # Cutting the stream makes the server abandon what it still runs for it.
            stream.call.cancel()
            stream.fail(failure)
            raise failure from None
        except grpc.aio.AioRpcError as exc:
            # The write failed: the stream is gone (its reader fails the others too).
            raise self._failure(exc) from exc
        except asyncio.InvalidStateError:
            # The call finished between opening and writing: answered like a broken stream.
            stream.fail(Unavailable("the lock session ended"))
            raise Unavailable("the lock session ended", reason="LOCK_SERVICE_UNAVAILABLE") from None
        finally:
            stream.pending.pop(request_id, None)

    async def close(self) -> None:
        """End the stream (unanswered requests fail with Unavailable)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.call.cancel()
            stream.fail(Unavailable("the lock client was closed"))
            if stream.reader is not None:
                await asyncio.gather(stream.reader, return_exceptions=True)

    def _open(self) -> _Stream:
        stream = self._stream
        if stream is None or stream.broken or stream.call.done():
            stream = self._stream = _Stream(self._stub.Session(metadata=self._metadata()))
            stream.reader = asyncio.create_task(self._read(stream))
        return stream

    async def _read(self, stream: _Stream) -> None:
        """Deliver answers by id until the stream ends; then fail whoever still waits."""
        failure: BaseException
        try:
            while True:
                response = await stream.call.read()
                if response is grpc.aio.EOF:
                    failure = Unavailable("the lock service ended the session")
                    break
                answer = stream.pending.get(response.id)
                if answer is not None and not answer.done():
                    answer.set_result(response)
        except grpc.aio.AioRpcError as exc:
            failure = self._failure(exc)
        except asyncio.CancelledError:
            failure = Unavailable("the lock session was cut")
        stream.fail(failure)

    def _failure(self, exc: grpc.aio.AioRpcError) -> BaseException:
        """What the requests of a stream that ended with `exc` raise: UNIMPLEMENTED means
        the service has no Session (from now on, unary calls)."""
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
            self.unsupported = True
            return SessionUnsupported()
        return self._stream_error(exc)
