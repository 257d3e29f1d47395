"""Stream positions read in batches: the streams that open at once share one query.

A Subscribe without a cursor starts at the user's position (`notify_user_streams.last_seq`),
read after its queue is registered (streams.py says why). Thousands of streams opening
together (a replica restart, a reconnect storm) each made that read on its own: one
database round trip and one pooled connection per stream. Here the reads waiting at the
same moment become one `SELECT ... WHERE (tenant_id, user_id) IN (...)` (at most
`max_batch` users a query): one reader task, the next batch gathering while a query runs.
Reading later than asked is safe: the queue was registered before the request.
"""

from __future__ import annotations

import asyncio
import itertools
from functools import partial

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common.db import read_only
from services.notify import reading
from services.notify.sql import retrying

UserKey = tuple[str, str]


class PositionReads:
    """Coalesces concurrent position reads (module docstring)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], max_batch: int = 500) -> None:
        self._sessions = sessions
        self._max = max_batch
        self._waiting: dict[UserKey, list[asyncio.Future[int]]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def read(self, tenant_id: str, user_id: str) -> int:
        """The user's last committed seq (0 before their first notification)."""
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault((tenant_id, user_id), []).append(answer)
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read_waiting(), name="stream-positions")
        return await answer

    async def _read_waiting(self) -> None:
        while self._waiting:
            keys = list(itertools.islice(self._waiting, self._max))
            batch = {key: self._waiting.pop(key) for key in keys}
            try:
                positions = await retrying(partial(self._query, keys))
            except Exception as exc:  # every waiter of the batch gets the error
                for answers in batch.values():
                    for answer in answers:
                        if not answer.done():
                            answer.set_exception(exc)
                continue
            for key, answers in batch.items():
                for answer in answers:
                    if not answer.done():  # a stream that left meanwhile
                        answer.set_result(positions.get(key, 0))

    async def _query(self, keys: list[UserKey]) -> dict[UserKey, int]:
        async with self._sessions() as session:
            await read_only(session)
            return await reading.stream_positions(session, keys)
