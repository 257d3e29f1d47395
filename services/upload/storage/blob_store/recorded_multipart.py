"""A merge's output written as an S3 multipart upload that is never orphaned.

    upload(key, blocks): [abort what a predecessor left for key] -> CreateMultipartUpload
        -> record (committed) -> UploadPart x N (`concurrency` in flight) -> Complete
        -> forget.  Any failure: Abort -> forget.  A kill: the record stays.
    reclaim(cutoff): abort every recorded upload started before cutoff, then (second net)
        every upload ListMultipartUploads shows under the store's prefixes started before it.

Invariants: a part is sent only after its upload is recorded, so a kill leaves at worst a
recorded upload (aborted by the re-run merge of the same key, or by the sweep once past
the grace), or — in the few milliseconds between CreateMultipartUpload's answer and the
record's commit — an unrecorded one that holds no part yet (the listing net's, where the
server lists). A record is forgotten only once S3 says the upload is gone (aborted, or
unknown: NoSuchUpload) or its key holds an object (it was completed). Output smaller than
one part needs no multipart upload: one PUT, all or nothing.

s3s-fs (the tests' server) answers AccessDenied, not NoSuchUpload, for an upload it no
longer knows, and has no ListMultipartUploads (NotImplemented): both are handled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any

from services.common.logging import get_logger
from services.upload import metrics
from services.upload.storage.blob_store.multipart_journal import MultipartJournal, Recorded
from services.upload.storage.blob_store.s3_multipart import S3Multipart, S3RequestFailed

log = get_logger(__name__)

# Where merges write (content_key): the listing net looks only here.
_MERGE_PREFIXES = ("files",)


class RecordedMultipart:
    """Multipart uploads through `client`, each recorded in `journal` while it runs (the
    journal is optional: a store opened without the database records nothing)."""

    def __init__(
        self,
        client: S3Multipart,
        journal: MultipartJournal | None,
        *,
        part_size: int,
        concurrency: int,
        exists: Callable[[str], Awaitable[bool]],
        put_whole: Callable[[str, bytes], Awaitable[None]],
    ) -> None:
        self._client = client
        self._journal = journal
        self._part_size = part_size
        self._concurrency = max(1, concurrency)
        self._exists = exists
        self._put_whole = put_whole
        self._listing_supported = True

    async def upload(self, key: str, blocks: AsyncIterator[Any]) -> None:
        """Write `blocks` to `key`: visible only once every block arrived and the stream
        ended cleanly (an exception raised by `blocks` aborts the upload)."""
        try:
            await self._upload(key, blocks)
        finally:
            # A failure mid-stream leaves the generator suspended: close it (its reads).
            aclose = getattr(blocks, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _upload(self, key: str, stream: AsyncIterator[Any]) -> None:
        await self.abort_recorded(key)
        buffer = bytearray()
        async for block in stream:
            buffer += block
            if len(buffer) >= self._part_size:
                break
        else:
            await self._put_whole(key, bytes(buffer))  # under one part: one PUT
            return
        upload_id = await self._client.create(key)
        if self._journal is not None:
            await self._journal.started(key, upload_id)
        try:
            etags = await self._send_parts(key, upload_id, buffer, stream)
            await self._client.complete(key, upload_id, etags)
        except BaseException:
            # Shielded: a cancelled merge still aborts; if the abort fails too, the record
            # stays for the re-run or the sweep, and the merge's own error is what counts.
            try:
                await asyncio.shield(self._abort(key, upload_id, reason="merge_failed"))
            except Exception as exc:
                log.warning("multipart_abort_failed", key=key, upload_id=upload_id, error=repr(exc))
            raise
        await self._forget(upload_id)

    async def _send_parts(
        self, key: str, upload_id: str, buffer: bytearray, stream: AsyncIterator[Any]
    ) -> list[str]:
        etags: dict[int, str] = {}
        pending: set[asyncio.Task[None]] = set()

        async def send(number: int, data: bytes) -> None:
            etags[number] = await self._client.upload_part(key, upload_id, number, data)

        async def room() -> None:
            while len(pending) >= self._concurrency:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                pending.difference_update(done)
                for task in done:
                    task.result()

        number = 0
        try:
            ended = False
            while not ended:
                while len(buffer) < self._part_size:
                    block = await anext(stream, None)
                    if block is None:
                        ended = True
                        break
                    buffer += block
                while len(buffer) >= self._part_size or (ended and buffer):
                    await room()
                    number += 1
                    part = bytes(buffer[: self._part_size])
                    del buffer[: self._part_size]
                    pending.add(asyncio.create_task(send(number, part)))
            await asyncio.gather(*pending)
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        return [etags[n] for n in range(1, number + 1)]

    async def _forget(self, upload_id: str) -> None:
        if self._journal is not None:
            await self._journal.finished(upload_id)

    async def _abort(self, key: str, upload_id: str, reason: str) -> bool:
        """Abort one upload and forget it once S3 says it is gone; False: kept (logged)."""
        try:
            await self._client.abort(key, upload_id)
        except S3RequestFailed as exc:
            # AccessDenied from s3s-fs, or NoSuchUpload handled in abort: an id the server
            # no longer knows. If the key holds an object, the upload was completed.
            try:
                completed = exc.status == 403 and await self._exists(key)
            except Exception:  # the store is down: keep the record for the next try
                completed = False
            if not completed:
                log.warning("multipart_abort_failed", key=key, upload_id=upload_id, error=str(exc))
                return False
        await self._forget(upload_id)
        metrics.MULTIPART_UPLOADS_ABORTED.labels(reason).inc()
        log.info("multipart_upload_aborted", key=key, upload_id=upload_id, reason=reason)
        return True

    async def abort_recorded(self, key: str) -> int:
        """Abort the uploads recorded for `key` (a killed predecessor's); how many."""
        if self._journal is None:
            return 0
        aborted = 0
        for record in await self._journal.for_key(key):
            aborted += await self._abort(record.key, record.upload_id, reason="rerun")
        return aborted

    async def reclaim(self, cutoff: datetime) -> int:
        """The sweep: recorded uploads started before `cutoff`, then the listing net."""
        aborted = 0
        records: list[Recorded] = []
        if self._journal is not None:
            records = await self._journal.older_than(cutoff)
        for record in records:
            aborted += await self._abort(record.key, record.upload_id, reason="sweep")
        for prefix in _MERGE_PREFIXES if self._listing_supported else ():
            try:
                listed = await self._client.list_in_progress(prefix)
            except S3RequestFailed as exc:
                if exc.status == 501:
                    self._listing_supported = False  # this server has no such call
                    log.info("multipart_listing_unsupported", error=str(exc))
                else:
                    log.warning("multipart_listing_failed", error=str(exc))
                break
            for found in listed:
                if found.initiated < cutoff:
                    aborted += await self._abort(found.key, found.upload_id, reason="listed")
        return aborted

    async def close(self) -> None:
        """Close the client's connections."""
        await self._client.close()
