"""The S3-compatible blob store (AWS S3, MinIO, Ceph RGW, R2...) through obstore.

How bytes are laid out (measured and argued in the README, "Blob store"):

- One object per chunk (`{prefix}/uploads/{upload_id}/{index}`), written by one PUT, which
  S3 makes visible all at once or not at all. Not multipart parts begun at CreateUpload:
  S3 requires parts of at least 5 MiB except the last, and chunks may be as small as
  `min_chunk_size` (256 KiB); and the whole-file checksum needs every byte read once anyway.
- `stage` keeps the (already received) bytes in memory; `publish` is the PUT. It runs
  after the chunk row's insert won (`chunks.py`), so only the row's inserter writes the key,
  and inside that transaction, as the local rename does: on PostgreSQL (what a replicated,
  S3-backed deployment runs) it holds only that chunk's unique key; on SQLite it would hold
  the database's write lock for the PUT, one more reason S3 goes with PostgreSQL.
- The merge reads the chunk objects (`concurrency` GETs in flight, in index order) through
  `merge_core.StreamingMerge` (every chunk's size and checksum, and the whole file's,
  verified as bytes pass; hashing
  on a worker thread with the GIL released) into a multipart upload of the final key. The
  upload is completed only after the last chunk and the whole file verified: a failure
  raises inside the byte stream, the upload is aborted, and no object ever appears.
  Memory: `concurrency` x (a chunk, at most `max_chunk_size`, + a part of `part_size`)
  plus the chunk being hashed, whatever the file's size.
- Multipart uploads are recorded while they run (`recorded_multipart.py`, the
  `s3_multipart_uploads` table): one a killed merge left is aborted by the re-run merge of
  its key or by the reclaim sweep (`abort_unfinished`). That needs the upload id, which
  obstore does not give, so with static keys the merge makes the multipart calls itself
  (`s3_multipart.py`); without (the AWS chain) it uses obstore's, unrecorded, and a bucket
  lifecycle rule (AbortIncompleteMultipartUpload) is the only net (logged at start).
- Downloads are range reads (`offset` onwards), split into blocks of at most `block`.

TLS: an endpoint whose certificate a private CA signed (on-prem MinIO) is trusted with
`SERENTAK_S3_CA_FILE` (read at start; obstore's requests and the multipart calls alike).

Settings: the SERENTAK_S3_* values are passed explicitly and win. obstore's S3 client also
consults the standard AWS chain (AWS_* variables, web identity, instance metadata) for what
they leave unset: the one deliberate exception to "only settings read the environment",
so a deployment on AWS can use its workload identity instead of static keys.

Store errors become `BlobStoreUnavailable` (UNAVAILABLE, retryable): a chunk PUT that
fails leaves the caller free to retry; a merge that fails is retried by the job runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import obstore
from obstore.store import S3Store
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import merge_core
from services.common.config import ConfigError
from services.common.logging import get_logger
from services.common.private_ca import https_context, read_ca_file
from services.upload import checksums
from services.upload.settings import UploadSettings
from services.upload.storage.blob_store.base import ChunkRef, Merged, StoredObject
from services.upload.storage.blob_store.multipart_journal import MultipartJournal
from services.upload.storage.blob_store.recorded_multipart import RecordedMultipart
from services.upload.storage.blob_store.s3_errors import store_errors
from services.upload.storage.blob_store.s3_multipart import (
    S3Multipart,
    location_of,
)
from services.upload.storage.blob_store.s3_read_ahead import ReadAhead

if TYPE_CHECKING:
    from obstore.store import ClientConfig  # a TypedDict of the stubs only

log = get_logger(__name__)

# Blocks read from the store at a time (merge, audit); hashing one releases the GIL.
READ_BLOCK = 8 * 1024 * 1024
# Below this a block is hashed on the event loop: a thread hop costs more.
_THREAD_FROM = 256 * 1024
# A request (and its retries) gives up after this long: a chunk PUT must not hang an RPC
# for obstore's default three minutes.
_RETRY: Any = {"max_retries": 3, "retry_timeout": timedelta(seconds=30)}
_CONNECT_TIMEOUT = timedelta(seconds=5)
# S3's limit for one CopyObject.
COPY_OBJECT_MAX = 5 * 1024**3


def s3_ca(settings: UploadSettings) -> bytes | None:
    """The PEM of `SERENTAK_S3_CA_FILE` (read now), None without one; ConfigError if it
    cannot be read or the endpoint is plain http:// (the CA would protect nothing)."""
    if settings.s3_ca_file is None:
        return None
    if urlsplit(settings.s3_endpoint or "").scheme == "http":
        raise ConfigError(
            "SERENTAK_S3_CA_FILE is set but SERENTAK_S3_ENDPOINT is not https://: "
            f"{settings.s3_endpoint}"
        )
    return read_ca_file(settings.s3_ca_file, "SERENTAK_S3_CA_FILE")


@dataclass(frozen=True, slots=True)
class _Staged:
    """A chunk's bytes between the checks and the PUT (nothing written yet)."""

    key: str
    data: bytes


async def _hash(target: Any, block: Any) -> None:
    """`target.update(block)`, off the event loop for large blocks (GIL released)."""
    if len(block) >= _THREAD_FROM:
        await asyncio.to_thread(target.update, block)
    else:
        target.update(block)


class S3BlobStore:
    """Objects in one bucket under one key prefix."""

    def __init__(
        self,
        store: S3Store,
        *,
        part_size: int = 8 * 1024 * 1024,
        concurrency: int = 4,
        description: str = "s3",
        multipart: S3Multipart | None = None,
        journal: MultipartJournal | None = None,
    ) -> None:
        self._store = store
        self._part_size = part_size
        self._concurrency = concurrency
        self.description = description
        # The largest object one CopyObject copies (S3's limit); bigger ones are streamed.
        self.copy_object_max = COPY_OBJECT_MAX
        self._recorded = (
            RecordedMultipart(
                multipart,
                journal,
                part_size=part_size,
                concurrency=concurrency,
                exists=self.exists,
                put_whole=self._put_whole,
            )
            if multipart is not None
            else None
        )

    @classmethod
    def from_settings(
        cls,
        settings: UploadSettings,
        sessions: async_sessionmaker[AsyncSession] | None = None,
    ) -> S3BlobStore:
        """The store `settings.blob_url` (s3://bucket/prefix) and the SERENTAK_S3_* name;
        with `sessions` (the upload database) its multipart uploads are recorded."""
        assert settings.blob_url is not None
        url = urlsplit(settings.blob_url)
        prefix = url.path.strip("/") or None
        secret = settings.s3_secret_access_key
        config: dict[str, Any] = {
            "region": settings.s3_region,
            "virtual_hosted_style_request": not settings.s3_path_style,
        }
        if settings.s3_endpoint:
            config["endpoint"] = settings.s3_endpoint
        if settings.s3_access_key_id:
            config["access_key_id"] = settings.s3_access_key_id
        if secret is not None:
            config["secret_access_key"] = secret.get_secret_value()
        client: ClientConfig = {
            "connect_timeout": _CONNECT_TIMEOUT,
            "allow_http": settings.s3_allow_http,
        }
        ca = s3_ca(settings)
        if ca is not None:
            client["root_certificate"] = ca  # added to the system's roots, not instead
        store = S3Store(
            url.netloc,
            prefix=prefix,
            client_options=client,
            retry_config=_RETRY,
            **config,
        )
        location = location_of(settings, url.netloc, prefix)
        if location is None:
            log.warning(
                "multipart_uploads_unrecorded",
                detail="no SERENTAK_S3_ACCESS_KEY_ID/SECRET_ACCESS_KEY: merges use obstore's "
                "multipart upload, which a killed merge can leave behind; set a bucket "
                "lifecycle rule (AbortIncompleteMultipartUpload)",
            )
        return cls(
            store,
            part_size=settings.s3_part_size,
            concurrency=settings.s3_merge_concurrency,
            description=f"s3://{url.netloc}/{prefix or ''}",
            multipart=(
                S3Multipart(location, trust=https_context(ca) if ca is not None else None)
                if location is not None
                else None
            ),
            journal=MultipartJournal(sessions) if sessions is not None else None,
        )

    async def put(self, key: str, data: bytes) -> None:
        """One PUT: all of the bytes become visible at once, or none."""
        await self.publish(_Staged(key, data), key)

    async def stage(self, key: str, data: bytes) -> object:
        """Nothing to write yet: the PUT in `publish` is the atomic step."""
        return _Staged(key, data)

    async def stage_checked(
        self, key: str, data: bytes, algorithm: str, expected: str
    ) -> tuple[object | None, str]:
        """The digest (on a worker thread), then `stage` when it is `expected`."""
        actual = await checksums.digest_async(data, algorithm)
        return (_Staged(key, data) if actual == expected else None), actual

    async def publish(self, staged: object, key: str) -> None:
        """One PUT of the staged bytes: all of them become visible at once, or none."""
        assert isinstance(staged, _Staged)
        with store_errors("put", key):
            await obstore.put_async(self._store, key, staged.data, use_multipart=False)

    async def publish_many(self, items: Sequence[tuple[object, str]]) -> None:
        """One PUT per staged object, all in flight at once (every one is awaited)."""
        results = await asyncio.gather(
            *(self.publish(staged, key) for staged, key in items), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def discard(self, staged: object) -> None:
        """Nothing was written by `stage`."""

    async def exists(self, key: str) -> bool:
        """True if an object is stored under `key` (a HEAD)."""
        try:
            with store_errors("head", key):
                await obstore.head_async(self._store, key)
        except FileNotFoundError:
            return False
        return True

    async def size(self, key: str) -> int:
        """Size of the object under `key` (a HEAD)."""
        with store_errors("head", key):
            meta = await obstore.head_async(self._store, key)
        return int(meta["size"])

    async def read(self, key: str, offset: int = 0, length: int = -1) -> bytes:
        """Bytes of `key` from `offset` (a range read)."""
        parts = [block async for block in self._blocks(key, offset, length, READ_BLOCK)]
        return b"".join(parts)

    async def iter_read(self, key: str, offset: int, block: int) -> AsyncIterator[bytes]:
        """`key`'s bytes from `offset` in blocks of at most `block` (one range read)."""
        async for data in self._blocks(key, offset, -1, block):
            yield data

    async def _blocks(self, key: str, offset: int, length: int, block: int) -> AsyncIterator[bytes]:
        if offset > 0 or length >= 0:
            size = await self.size(key)
            end = size if length < 0 else min(size, offset + length)
            if offset >= end:
                return
            options: Any = {"range": (offset, end)}
        else:
            options = None
        with store_errors("get", key):
            result = await obstore.get_async(self._store, key, options=options)
            async for piece in result.stream(min_chunk_size=block):
                view = memoryview(piece)
                for start in range(0, len(view), block):
                    yield bytes(view[start : start + block])

    async def copy(self, source: str, key: str) -> None:
        """One server-side CopyObject (no bytes through this process) up to the 5 GiB S3
        allows in one; above that, `source` streamed into a multipart upload of `key`
        (memory: the parts in flight), completed only once every byte was read."""
        size = await self.size(source)
        with store_errors("copy", key):
            if size <= self.copy_object_max:
                await obstore.copy_async(self._store, source, key)
                return
            await obstore.put_async(
                self._store,
                key,
                self._blocks(source, 0, -1, self._part_size),
                use_multipart=True,
                chunk_size=self._part_size,
                max_concurrency=self._concurrency,
            )

    async def delete(self, key: str) -> None:
        """Delete the object under `key` (missing is fine)."""
        with contextlib.suppress(FileNotFoundError), store_errors("delete", key):
            await obstore.delete_async(self._store, key)

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix/` (listed, then deleted in batches)."""
        count = 0
        with store_errors("delete", prefix):
            async for batch in obstore.list(self._store, prefix.rstrip("/") + "/"):
                paths = [meta["path"] for meta in batch]
                if paths:
                    await obstore.delete_async(self._store, paths)
                    count += len(paths)
        return count

    async def _put_whole(self, key: str, data: bytes) -> None:
        await obstore.put_async(self._store, key, data, use_multipart=False)

    async def abort_unfinished(self, before: datetime) -> int:
        """Abort multipart uploads of merges started before `before` and never finished
        (recorded, or listed where the server lists them); how many."""
        if self._recorded is None:
            return 0
        with store_errors("abort multipart", "files"):
            return await self._recorded.reclaim(before)

    async def list_objects(self, prefix: str) -> AsyncIterator[StoredObject]:
        """Every object under `prefix/` (S3 has no temp objects: an unfinished multipart
        upload is not an object; `abort_unfinished` takes care of those)."""
        with store_errors("list", prefix):
            async for batch in obstore.list(self._store, prefix.rstrip("/") + "/"):
                for meta in batch:
                    modified = meta["last_modified"]
                    if modified.tzinfo is None:
                        modified = modified.replace(tzinfo=UTC)
                    yield StoredObject(str(meta["path"]), int(meta["size"]), modified)

    async def merge(
        self,
        chunks: Sequence[ChunkRef],
        key: str,
        algorithm: str,
        expected_checksum: str | None,
    ) -> Merged:
        """Chunk objects, in index order and verified, into a multipart upload of `key`,
        completed only once everything verified (module docstring)."""
        verifier = merge_core.StreamingMerge(
            [merge_core.Chunk(c.index, c.key, c.size, c.checksum) for c in chunks],
            algorithm,
            expected_checksum,
        )
        finished: list[tuple[int, str, str, int]] = []
        ordered = sorted(chunks, key=lambda c: c.index)

        async def verified_blocks() -> AsyncIterator[Any]:
            async with ReadAhead(self._store, ordered, self._concurrency) as reader:
                for chunk in ordered:
                    assert verifier.next_index == chunk.index
                    data = await reader.next()
                    await _hash(verifier, data)
                    verifier.end_chunk()
                    yield data
            # Raises on a whole-file mismatch *inside* the stream: the upload is never
            # completed. Only a clean end of this generator completes it.
            finished.append(verifier.finish())

        with store_errors("multipart put", key):
            if self._recorded is not None:
                await self._recorded.upload(key, verified_blocks())
            else:
                await obstore.put_async(
                    self._store,
                    key,
                    verified_blocks(),
                    use_multipart=True,
                    chunk_size=self._part_size,
                    max_concurrency=self._concurrency,
                )
        size, checksum, algorithm_name, count = finished[0]
        return Merged(key, size, checksum, algorithm_name, count)

    async def checksum(self, key: str, algorithm: str) -> str:
        """Read the object back through merge_core's hasher (GIL released per block)."""
        hasher = merge_core.Hasher(algorithm)
        async for block in self._blocks(key, 0, -1, READ_BLOCK):
            await _hash(hasher, block)
        return hasher.hexdigest()

    async def close(self) -> None:
        """Close the multipart client (obstore's pool needs no explicit close)."""
        if self._recorded is not None:
            await self._recorded.close()
