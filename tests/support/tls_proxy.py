"""A TLS-terminating forwarder on 127.0.0.1, for servers that speak only plaintext (s3s-fs):
clients reach `endpoint` over TLS with a certificate from a test CA, the forwarder passes
the bytes on in clear to the server on loopback. One asyncio loop in a thread of its own
(asyncio's TLS runs on memory buffers, so one connection is never read and written from two
threads at once, which an `ssl.SSLSocket` does not allow)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading

from support.pki import CertFiles

_BUFFER = 65536
# A peer that opens a connection and never completes the handshake is dropped after this.
_HANDSHAKE_TIMEOUT_S = 10.0


class TlsProxy:
    """Forwards TLS on 127.0.0.1:`port` to plaintext `target`, serving `cert` (as a context
    manager: listening inside the `with`)."""

    def __init__(self, target_host: str, target_port: int, cert: CertFiles) -> None:
        self.target = (target_host, target_port)
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(cert.cert, cert.key)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self.port = 0
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def endpoint(self) -> str:
        """The https:// URL clients dial."""
        return f"https://127.0.0.1:{self.port}"

    def __enter__(self) -> TlsProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(30)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *_exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(
            self._serve,
            "127.0.0.1",
            0,
            ssl=self._context,
            ssl_handshake_timeout=_HANDSHAKE_TIMEOUT_S,
        )

    async def _close(self) -> None:
        assert self._server is not None
        self._server.close()
        # Open connections are cut, as a stopped server's would be (before waiting: newer
        # Pythons' wait_closed waits for them).
        for connection in self._connections:
            connection.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        up_writer: asyncio.StreamWriter | None = None
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        except OSError:
            pass  # the server is down: the client sees its connection closed
        finally:
            self._connections.discard(task)
            for end in (writer, up_writer):
                if end is not None:
                    end.close()

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(_BUFFER):
                dst.write(data)
                await dst.drain()
        except OSError:
            pass  # either end went away (ssl.SSLError is an OSError)
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                dst.close()
