"""Reading a tus request's body: streamed in blocks (keeping what arrived before a cut),
or spooled to a private temp file first when it must be verified whole (Upload-Checksum)
or its size is unknown (no Content-Length)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

from aiohttp import web

from services.upload.metrics import TUS_BYTES_RECEIVED
from services.upload.tus import protocol as tus
from services.upload.tus.protocol import TusError

# Big enough to keep the per-block overhead small; bounded memory per request.
BLOCK = 1024 * 1024


async def body(request: web.Request) -> AsyncIterator[bytes]:
    """The body in blocks; on a cut connection, the bytes that did arrive, then the error."""
    stream = request.content
    try:
        async for block in stream.iter_chunked(BLOCK):
            TUS_BYTES_RECEIVED.inc(len(block))
            yield block
    except ConnectionError:
        # aiohttp raises the loss before handing over what it had buffered: those bytes
        # arrived in order and are the body's next ones (the spec: store as much as possible).
        rest = stream._read_nowait(-1)
        if rest:
            TUS_BYTES_RECEIVED.inc(len(rest))
            yield rest
        raise


async def spool(
    request: web.Request, folder: Path, limit: int, checksum: tus.Checksum | None
) -> Path:
    """The whole body in a temp file (at most `limit` bytes: 413), checked against
    Upload-Checksum (460); nothing of a refused body is kept."""
    path = folder / f".spool-{uuid.uuid4().hex}"
    hasher = checksum.hasher() if checksum is not None else None
    total = 0
    out = await asyncio.to_thread(private_file, path)
    try:
        async for block in request.content.iter_chunked(BLOCK):
            TUS_BYTES_RECEIVED.inc(len(block))
            total += len(block)
            if total > limit:
                raise TusError(
                    413, "UPLOAD_LENGTH_EXCEEDED", f"the body is over the {limit} bytes left"
                )
            await asyncio.to_thread(out.write, block)
            if hasher is not None:
                await asyncio.to_thread(hasher.update, block)
        await asyncio.to_thread(out.close)
        if checksum is not None and hasher is not None and hasher.digest() != checksum.digest:
            raise TusError(
                tus.CHECKSUM_MISMATCH,
                "CHECKSUM_MISMATCH",
                f"the body's {checksum.algorithm} differs",
            )
    except BaseException:
        out.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return path


def private_file(path: Path) -> BinaryIO:
    """A new file only its owner may read (users' bytes)."""
    return open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")


async def read_file(path: Path) -> AsyncIterator[bytes]:
    """A spooled body in blocks, read off the loop."""
    source = await asyncio.to_thread(open, path, "rb")
    try:
        while block := await asyncio.to_thread(source.read, BLOCK):
            yield block
    finally:
        source.close()
