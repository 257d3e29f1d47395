"""Cross-process wake-ups on PostgreSQL: LISTEN for what other processes commit.

Migration runtime_0002 makes every transaction that inserts into `jobs` or
`outbox_events` NOTIFY a channel at commit. One listener per process holds a dedicated
connection (outside the pool: it sits in LISTEN for the process's lifetime) and calls
the matching wake-up, so an idle worker claims within a round trip of the enqueue's
commit instead of at its next poll. A notification only says "look now": the claim
decides what runs, and polling remains the fallback (a lost connection, SQLite).

A channel may also have a payload handler (`payloads`): it gets each notification's
payload, while the plain wake-up runs only on (re)connect, to look at whatever was
committed while nobody listened (notify's live streams use this, see
`services.notify.stream_listener`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import psycopg
from sqlalchemy.engine import URL

from services.common.logging import get_logger

log = get_logger(__name__)

JOBS_CHANNEL = "serentak_jobs"
OUTBOX_CHANNEL = "serentak_outbox"
DEFAULT_RECONNECT_SECONDS = 1.0


def libpq_url(url: URL) -> str:
    """The libpq form of a SQLAlchemy PostgreSQL URL (for a raw psycopg connection)."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


class CommitListener:
    """Calls `wakeups[channel]()` for each notification on that channel, until cancelled.

    For a channel in `payloads`, each notification calls `payloads[channel](payload)`
    instead, and `wakeups[channel]()` runs only when LISTEN (re)starts.
    """

    def __init__(
        self,
        url: URL,
        wakeups: Mapping[str, Callable[[], None]],
        *,
        payloads: Mapping[str, Callable[[str], None]] | None = None,
        reconnect_seconds: float = DEFAULT_RECONNECT_SECONDS,
    ) -> None:
        self._payloads = dict(payloads or {})
        unknown = set(self._payloads) - set(wakeups)
        if unknown:
            raise ValueError(f"payload handlers without a wake-up: {sorted(unknown)}")
        for channel in wakeups:
            if not channel.isidentifier():
                raise ValueError(f"bad channel name {channel!r}")
        self._conninfo = libpq_url(url)
        self._wakeups = dict(wakeups)
        self._reconnect_seconds = reconnect_seconds
        # Set while LISTEN is in effect (tests wait on it before enqueueing).
        self.listening = asyncio.Event()
        # Notifications received, per channel.
        self.received: dict[str, int] = dict.fromkeys(self._wakeups, 0)

    async def run(self) -> None:
        """Listen, reconnecting after `reconnect_seconds` whenever the connection fails."""
        while True:
            try:
                await self._listen()
            except Exception as exc:
                log.warning("commit_listener_disconnected", error=f"{type(exc).__name__}: {exc}")
            finally:
                self.listening.clear()
            # A timer between reconnect attempts, not synchronisation.
            await asyncio.sleep(self._reconnect_seconds)

    async def _listen(self) -> None:
        async with await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True) as conn:
            for channel in self._wakeups:
                await conn.execute(f"LISTEN {channel}")
            self.listening.set()
            log.info("commit_listener_listening", channels=sorted(self._wakeups))
            # Whatever was committed while nobody listened: look once now.
            for wake in self._wakeups.values():
                wake()
            async for notify in conn.notifies():
                if notify.channel in self._wakeups:
                    self.received[notify.channel] += 1
                    on_payload = self._payloads.get(notify.channel)
                    if on_payload is not None:
                        on_payload(notify.payload)
                    else:
                        self._wakeups[notify.channel]()
