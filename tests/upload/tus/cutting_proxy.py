"""A TCP proxy that kills a connection after a given number of client bytes: a client's
connection cut mid-request, for real (the server sees the stream end early)."""

from __future__ import annotations

import asyncio
import contextlib


class CuttingProxy:
    """Forwards 127.0.0.1:`port` to `target`; cuts the first connection that carries
    `cut_after` bytes from the client (exactly those reach the server, then both sides
    are closed); connections after it pass untouched."""

    def __init__(self, target_port: int, cut_after: int) -> None:
        self._target_port = target_port
        self._cut_after = cut_after
        self.cut = asyncio.Event()
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> CuttingProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target_port)
        limit = None if self.cut.is_set() else self._cut_after

        async def upstream() -> None:
            sent = 0
            while data := await reader.read(65536):
                if limit is not None and sent + len(data) >= limit:
                    up_writer.write(data[: limit - sent])
                    await up_writer.drain()
                    self.cut.set()
                    break
                up_writer.write(data)
                await up_writer.drain()
                sent += len(data)
            up_writer.close()
            writer.close()

        async def downstream() -> None:
            with contextlib.suppress(ConnectionError):
                while data := await up_reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            writer.close()

        with contextlib.suppress(ConnectionError):
            await asyncio.gather(upstream(), downstream())
