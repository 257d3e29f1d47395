"""Group commit of chunk rows: every chunk waiting to be recorded goes into one transaction.

A chunk reaches the committer checked, hashed and staged (its bytes durable under a
temporary name). Chunks queue here from PutChunk calls and UploadChunks pipelines alike;
one flusher task per process takes everything queued (up to `MAX_BATCH`) and records it
in ONE transaction (one SQLite WAL fsync, one PostgreSQL commit round trip): while a batch
commits, the next one gathers. Each caller gets its answer only after that commit, so a
chunk is acknowledged only when its bytes and its row are durable.

The batch's transaction, in this order (the chunks module docstring says why the rename
comes after the insert):
1. one multi-row `INSERT ... ON CONFLICT DO NOTHING RETURNING (upload_id, chunk_index)`;
   an index sent twice in one batch is inserted for its first sender only. A chunk whose
   row exists already ("lost") is answered after the commit, as a duplicate or conflict.
2. every inserted chunk's bytes renamed into place, each folder fsynced once.
3. per upload (in id order: two processes' batches lock rows in the same order), one
   `UPDATE uploads ... RETURNING` counting its chunks; the one that completes the set
   moves it to `merging` and enqueues the merge in this transaction (invariant 3). An
   upload that stopped accepting chunks (aborted, expired) has its rows of this batch
   deleted again and its chunks fail UPLOAD_NOT_ACTIVE; the rest of the batch commits.

A batch whose transaction fails fails exactly its own chunks, with that error, and
removes their staged bytes; nothing was recorded for them, so a retry stores them. The
flusher is not any caller's task: a caller cancelled while its chunk is in a batch does
not roll the batch back (its chunk may be stored unacknowledged; a retry answers
`duplicate`); one cancelled while still queued is withdrawn and its bytes removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Table, delete, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from services.common import tracing
from services.common.correlation import bound_correlation_id, current_correlation_id
from services.common.jobs import ClaimedJob
from services.common.logging import get_logger
from services.common.session_rows import new_object
from services.upload import metrics
from services.upload.errors import UploadNotActive
from services.upload.ingest.batch_statements import BatchStatements
from services.upload.ingest.uploads import MergeClaimer, MergeEnqueuer, log_transition
from services.upload.models import MERGING, UPLOADING, ChunkRow, UploadRow, utcnow
from services.upload.storage.blob_store import BlobStore

log = get_logger(__name__)

# At most this many chunks in one transaction (one INSERT's parameters stay small).
MAX_BATCH = 64
_CHUNKS: Table = ChunkRow.__table__  # type: ignore[assignment]
_UPLOADS: Table = UploadRow.__table__  # type: ignore[assignment]
_UPLOAD_COLUMNS = [c.key for c in _UPLOADS.columns]


class Chain:
    """The chunks of one UploadChunks stream: once one of them fails (or the stream ends
    with an error), its later chunks still queued are withdrawn, never recorded."""

    __slots__ = ("failed",)

    def __init__(self) -> None:
        self.failed = False


@dataclass(frozen=True, slots=True)
class Recorded:
    """A chunk this batch inserted: the upload as a sequential sender would see it after
    this chunk (its count up to this chunk of the batch, `merging` only for the last)."""

    upload: UploadRow
    started_merge: bool
    # The merge job, leased to this chunk's sender, when it started the merge with a claimer.
    claimed: ClaimedJob | None = None


@dataclass(frozen=True, slots=True)
class Lost:
    """The index had a row already (an earlier commit, or an earlier chunk of this batch):
    answered as a duplicate or conflict by the caller. `upload`: the upload as seen at
    this chunk's place in the batch, when the batch counted that upload (else None)."""

    upload: UploadRow | None


@dataclass(eq=False)
class _Item:
    upload: UploadRow
    index: int
    size: int
    checksum: str
    key: str
    staged: object
    chain: Chain | None
    # Set: if this chunk completes the set, the merge is enqueued leased to its sender.
    claim: MergeClaimer | None
    done: asyncio.Future[Recorded | Lost] = field(init=False)
    # The sending call's id and trace: the merge a chunk starts runs under them.
    correlation_id: str = field(init=False)
    traceparent: str | None = field(init=False)

    def __post_init__(self) -> None:
        self.done = asyncio.get_running_loop().create_future()
        self.correlation_id = current_correlation_id()
        self.traceparent = tracing.current_traceparent()


Hook = Callable[[str, int], Awaitable[None]] | None


class ChunkCommitter:
    """Records staged chunks in group commits (module docstring)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        blobs: BlobStore,
        enqueue_merge: MergeEnqueuer,
        *,
        upload_ttl_seconds: float,
        after_write: Callable[[], Hook],
    ) -> None:
        self._engine = sessions.kw["bind"]
        self._statements = BatchStatements(self._engine.dialect)
        self._blobs = blobs
        self._enqueue_merge = enqueue_merge
        self._ttl = upload_ttl_seconds
        # The test-only hook, read at each batch (the chunks module owns the switch).
        self._after_write = after_write
        self._queue: deque[_Item] = deque()
        self._flusher: asyncio.Task[None] | None = None
        # Connections on their way back to the pool, which `close` waits for.
        self._hand_backs: set[asyncio.Task[None]] = set()

    @property
    def queued(self) -> int:
        """Chunks waiting for the next batch (the batch in flight not included)."""
        return len(self._queue)

    async def record(
        self,
        upload: UploadRow,
        index: int,
        size: int,
        checksum: str,
        key: str,
        staged: object,
        chain: Chain | None = None,
        claim: MergeClaimer | None = None,
    ) -> Recorded | Lost:
        """Queue a staged chunk for the next group commit; its result once committed.

        `claim`: if this chunk completes the set, the merge job is enqueued by it (leased
        to the caller, `Recorded.claimed`) instead of by the committer's enqueuer.
        Raises the batch's error (the staged bytes are removed then), or UPLOAD_NOT_ACTIVE.
        """
        item = _Item(upload, index, size, checksum, key, staged, chain, claim)
        self._queue.append(item)
        if self._flusher is None or self._flusher.done():
            # A context of its own: not the first caller's correlation id.
            self._flusher = asyncio.create_task(
                self._flush(), name="chunk-group-commit", context=contextvars.Context()
            )
        try:
            return await asyncio.shield(item.done)
        except asyncio.CancelledError:
            if item in self._queue:
                # Never reached a batch: withdraw it and remove its bytes.
                self._queue.remove(item)
                await asyncio.shield(self._blobs.discard(staged))
            elif not item.done.done():
                # In a batch: it commits or fails (its bytes removed) without us; return
                # only after that, so no staged file outlives the call.
                with contextlib.suppress(BaseException):
                    await asyncio.shield(item.done)
            raise

    async def close(self) -> None:
        """Stop the flusher (service shutdown): queued chunks fail CANCELLED."""
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        # A flusher cancelled while handing its connection back ends before the hand-back
        # does: wait for it, or the pool could be disposed with the connection still out.
        for hand_back in list(self._hand_backs):
            with contextlib.suppress(Exception):
                await hand_back
        while self._queue:
            item = self._queue.popleft()
            item.done.cancel()
            await self._blobs.discard(item.staged)

    async def _flush(self) -> None:
        # `record` starts a flusher only when none is running: a chunk queued while this
        # one returns its connection is taken by another round (no await after the check).
        while self._queue:
            try:
                await self._drain()
            except Exception as error:  # closing a broken connection: the next round opens one
                log.warning("chunk_committer_connection_error", error=repr(error))

    async def _drain(self) -> None:
        # One connection for a run of back-to-back batches: a batch pays no pool checkout
        # (on PostgreSQL a pre-ping round trip) and no reset; it goes back once the queue
        # is empty, or after a failed batch (which may have broken it).
        connection: AsyncConnection | None = None
        session: AsyncSession | None = None
        try:
            while self._queue:
                batch: list[_Item] = []
                withdrawn: list[_Item] = []
                while self._queue and len(batch) < MAX_BATCH:
                    item = self._queue.popleft()
                    failed = item.chain is not None and item.chain.failed
                    (withdrawn if failed else batch).append(item)
                if withdrawn:
                    await asyncio.shield(self._discard(withdrawn))
                for item in withdrawn:
                    item.done.cancel()
                if not batch:
                    continue
                if connection is None or session is None:
                    try:
                        connection = await self._engine.connect()
                    except Exception as error:  # the database is unreachable: this batch fails
                        await self._fail(batch, error)
                        continue
                    # Joins the connection's transaction (the batch's) for the ORM parts.
                    session = AsyncSession(bind=connection, expire_on_commit=False)
                ok = await self._commit(connection, session, batch)
                if not ok:
                    session = None  # its transaction is over; the connection may be broken
                    with contextlib.suppress(Exception):
                        # Not back to the pool: a statement run on the driver may have
                        # broken it without SQLAlchemy seeing the error.
                        await connection.invalidate()
                    with contextlib.suppress(Exception):
                        await connection.close()
                    connection = None
                else:
                    await session.close()  # forget the batch's rows; the connection stays
        finally:
            # One shielded step for both: a shutdown cancelling the flusher while it waits
            # for the session's close must not skip the connection's (a pooled connection
            # never returned is only reclaimed by the garbage collector).
            hand_back = asyncio.ensure_future(_hand_back(session, connection))
            self._hand_backs.add(hand_back)
            hand_back.add_done_callback(self._hand_backs.discard)
            await asyncio.shield(hand_back)

    async def _commit(
        self, connection: AsyncConnection, session: AsyncSession, batch: list[_Item]
    ) -> bool:
        """One batch's transaction, then every caller's answer (False: it failed). Staged
        bytes that were not published are removed *before* anyone is answered (a caller
        then sees no temp file)."""
        try:
            results = await self._transaction(connection, session, batch)
        except BaseException as error:
            await self._fail(batch, error)
            if not isinstance(error, Exception):
                raise
            log.warning("chunk_batch_failed", chunks=len(batch), error=repr(error))
            return False
        metrics.CHUNK_COMMIT_BATCH.observe(len(batch))
        lost = [i for i in batch if isinstance(results[id(i)], Lost)]
        if lost:
            # Their index was stored by another send: their bytes go.
            await asyncio.shield(self._discard(lost))
        for item in batch:
            result = results[id(item)]
            if isinstance(result, Exception):
                if item.chain is not None:
                    item.chain.failed = True
                item.done.set_exception(result)
            else:
                item.done.set_result(result)
        return True

    async def _fail(self, batch: list[_Item], error: BaseException) -> None:
        """Every chunk of `batch` fails with `error`, its staged bytes removed first."""
        await asyncio.shield(self._discard(batch))
        for item in batch:
            if item.chain is not None:
                item.chain.failed = True
            if isinstance(error, asyncio.CancelledError):
                item.done.cancel()
            else:
                item.done.set_exception(error)

    async def _discard(self, items: list[_Item]) -> None:
        for item in items:
            try:
                await self._blobs.discard(item.staged)
            except Exception as error:  # a leftover temp file is the orphan sweep's
                log.warning("chunk_discard_failed", key=item.key, error=repr(error))

    async def _transaction(
        self, connection: AsyncConnection, session: AsyncSession, batch: list[_Item]
    ) -> dict[int, Recorded | Lost | Exception]:
        now = utcnow()
        # First sender of each index in this batch; a later one is lost to it.
        first: dict[tuple[str, int], _Item] = {}
        for item in batch:
            first.setdefault((item.upload.id, item.index), item)
        async with connection.begin():
            driver = await self._statements.driver(connection)
            rows = await self._statements.insert_chunks(
                driver,
                [
                    {
                        "upload_id": i.upload.id,
                        "chunk_index": i.index,
                        "size": i.size,
                        "checksum": i.checksum,
                        "blob_key": i.key,
                        "created_at": now,
                        "attempts": 1,
                    }
                    # Key order: two processes' batches take the index locks alike.
                    for _, i in sorted(first.items(), key=lambda kv: kv[0])
                ],
            )
            inserted_keys = set(rows)
            inserted = [i for k, i in first.items() if k in inserted_keys]
            # Our rows: we are the only writer of these keys (chunks module docstring).
            if inserted:
                await self._blobs.publish_many([(i.staged, i.key) for i in inserted])
            hook = self._after_write()
            if hook is not None:
                for item in inserted:
                    await hook(item.upload.id, item.index)
            results = await self._count(connection, driver, session, batch, inserted, now)
            await session.flush()
        return results

    async def _count(
        self,
        connection: AsyncConnection,
        driver: Any,
        session: AsyncSession,
        batch: list[_Item],
        inserted: list[_Item],
        now: datetime,
    ) -> dict[int, Recorded | Lost | Exception]:
        """Count each upload's inserted chunks; every item's result. `session` (on the
        same connection and transaction) only enqueues a merge."""
        mine = {id(i) for i in inserted}
        per_upload: dict[str, list[_Item]] = {}
        for item in inserted:
            per_upload.setdefault(item.upload.id, []).append(item)
        fresh: dict[str, UploadRow | None] = {}
        claimed: dict[str, ClaimedJob] = {}
        for upload_id in sorted(per_upload):
            n = len(per_upload[upload_id])
            row = await self._statements.count(
                driver, upload_id, n, now, now + timedelta(seconds=self._ttl)
            )
            fresh[upload_id] = row
            if row is None:
                # Aborted or expired meanwhile: its rows go again (the bytes are orphans).
                indexes = [i.index for i in per_upload[upload_id]]
                await connection.execute(
                    delete(_CHUNKS).where(
                        tuple_(_CHUNKS.c.upload_id, _CHUNKS.c.chunk_index).in_(
                            [(upload_id, x) for x in indexes]
                        )
                    )
                )
            elif row.status == MERGING:
                # Under the id and trace of the call whose chunk completed the set.
                completing = per_upload[upload_id][-1]
                with (
                    bound_correlation_id(completing.correlation_id),
                    tracing.resumed(completing.traceparent),
                ):
                    log_transition(upload_id, UPLOADING, MERGING)
                    log.info("upload_merge_started", upload_id=upload_id, file_id=row.file_id)
                    # The chunk that completes the set is this upload's last of the batch.
                    claim = completing.claim
                    job = None if claim is None else await claim(session, row)
                    if job is None:
                        await self._enqueue_merge(session, row)
                    else:
                        claimed[upload_id] = job
        results: dict[int, Recorded | Lost | Exception] = {}
        # Walk each upload's chunks in queue order: what a sequential sender would see.
        seen: dict[str, int] = {}
        for item in batch:
            upload_id = item.upload.id
            row = fresh.get(upload_id)
            if upload_id in fresh and row is None:
                results[id(item)] = UploadNotActive(
                    "the upload stopped accepting chunks", upload_id=upload_id
                )
                continue
            if row is None:
                results[id(item)] = Lost(None)
                continue
            count = len(per_upload[upload_id])
            if id(item) in mine:
                seen[upload_id] = seen.get(upload_id, 0) + 1
            before = row.received_chunk_count - count + seen.get(upload_id, 0)
            last = seen.get(upload_id, 0) == count
            view = row if last else _as_of(row, before, UPLOADING)
            if id(item) in mine:
                started = last and row.status == MERGING
                results[id(item)] = Recorded(
                    view, started_merge=started, claimed=claimed.get(upload_id) if started else None
                )
            else:
                results[id(item)] = Lost(view)
        return results


def _as_of(row: UploadRow, received: int, status: str) -> UploadRow:
    """A detached copy of `row` with another count and status (an earlier point in the
    batch); never added to a session."""
    values: dict[str, Any] = {key: getattr(row, key) for key in _UPLOAD_COLUMNS}
    values.update(received_chunk_count=received, status=status)
    return new_object(UploadRow, values)


async def _hand_back(session: AsyncSession | None, connection: AsyncConnection | None) -> None:
    """Close the batch session, then return the connection to the pool (both if given)."""
    try:
        if session is not None:
            await session.close()
    finally:
        if connection is not None:
            await connection.close()
