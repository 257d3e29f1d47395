"""`serentak.admin.v1.AdminService`: the operator's view of a service's queue and DLQ.

Generic over the service: it only needs a session factory on a database that has the
runtime's tables. Every call requires the ops role (the `ops` principal, or a token with
`ops` in its roles): queue contents and dead-letter payloads are internal data.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf import timestamp_pb2
from serentak.admin.v1 import admin_pb2, admin_pb2_grpc
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from services.common import audit
from services.common.auth import Authenticator
from services.common.errors import InvalidArgument, NotFound
from services.common.jobs.dead_letters import (
    DeadLetterNotFound,
    list_dead_letters,
    purge_dead_letters,
    replay_dead_letter,
)
from services.common.jobs.stats import queue_stats
from services.common.logging import get_logger

log = get_logger(__name__)

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
SERVICE_NAME = admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name


def _timestamp(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def dead_letter_message(row: dict[str, Any]) -> admin_pb2.DeadLetter:
    """A dead_letters row as its protobuf message."""
    return admin_pb2.DeadLetter(
        id=row["id"],
        job_id=row["job_id"],
        job_type=row["job_type"],
        partition_key=row["partition_key"],
        idempotency_key=row["idempotency_key"],
        payload_json=json.dumps(row["payload"], sort_keys=True),
        error_class=row["error_class"],
        error_type=row["error_type"],
        error_message=row["error_message"],
        traceback=row["traceback"],
        attempts=row["attempts"],
        worker_id=row["worker_id"],
        first_attempt_at=_timestamp(row["first_attempt_at"]),
        last_attempt_at=_timestamp(row["last_attempt_at"]),
        dead_at=_timestamp(row["dead_at"]),
        correlation_id=row["correlation_id"],
        replayed_at=_timestamp(row["replayed_at"]),
    )


def audit_event_message(row: dict[str, Any]) -> admin_pb2.AuditEvent:
    """An audit_events row as its protobuf message."""
    return admin_pb2.AuditEvent(
        id=row["id"],
        at=_timestamp(row["at"]),
        tenant_id=row["tenant_id"],
        principal=row["principal"],
        action=row["action"],
        target_type=row["target_type"],
        target_id=row["target_id"],
        correlation_id=row["correlation_id"],
        detail_json=json.dumps(row["detail"], sort_keys=True),
    )


def _page_size(value: int) -> int:
    if value < 0:
        raise InvalidArgument("page_size", "must not be negative")
    return min(value or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def _page_after(token: str) -> int:
    """The id a page token carries (0: the first page)."""
    if not token:
        return 0
    if not token.isdigit():
        raise InvalidArgument(
            "page_token", "not a token from a previous page", reason="INVALID_PAGE_TOKEN"
        )
    return int(token)


def audit_query(request: admin_pb2.ListAuditEventsRequest) -> audit.AuditQuery:
    """The request's filters, checked: INVALID_ARGUMENT naming the field otherwise."""
    since = request.since.ToDatetime(tzinfo=UTC) if request.HasField("since") else None
    until = request.until.ToDatetime(tzinfo=UTC) if request.HasField("until") else None
    if since is not None and until is not None and until <= since:
        raise InvalidArgument("until", "must be after since", reason="EMPTY_TIME_RANGE")
    for field in ("tenant_id", "principal", "target_id"):
        if len(getattr(request, field)) > 255:
            raise InvalidArgument(field, "longer than 255 characters")
    return audit.AuditQuery(
        tenant_id=request.tenant_id,
        principal=request.principal,
        target_id=request.target_id,
        since=since,
        until=until,
        before_id=_page_after(request.page_token),
        limit=_page_size(request.page_size) + 1,
    )


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    """QueueStats, ListDeadLetters, ReplayDeadLetter, PurgeDeadLetters, ListAuditEvents."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], authenticator: Authenticator
    ) -> None:
        self._sessions = sessions
        self._auth = authenticator

    async def QueueStats(
        self, request: admin_pb2.QueueStatsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.QueueStatsResponse:
        """Depth and lag per job type, oldest unpublished event, dead-letter count."""
        self._auth.require_ops(context)
        async with self._sessions() as session, session.begin():
            stats = await queue_stats(session)
        return admin_pb2.QueueStatsResponse(
            job_types=[
                admin_pb2.JobTypeStats(
                    job_type=t.job_type,
                    queued=t.queued,
                    running=t.running,
                    lag_seconds=t.lag_seconds,
                    dead_letters=t.dead_letters,
                )
                for t in stats.job_types
            ],
            unpublished_events=stats.unpublished_events,
            oldest_unpublished_event_age_seconds=stats.oldest_unpublished_event_age_seconds,
            dead_letter_count=stats.dead_letter_count,
        )

    async def ListDeadLetters(
        self, request: admin_pb2.ListDeadLettersRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListDeadLettersResponse:
        """Dead letters oldest first; page_token is the last id seen."""
        self._auth.require_ops(context)
        size = _page_size(request.page_size)
        after = _page_after(request.page_token)
        async with self._sessions() as session, session.begin():
            rows = await list_dead_letters(
                session, job_type=request.job_type, after_id=after, limit=size + 1
            )
        more = len(rows) > size
        rows = rows[:size]
        return admin_pb2.ListDeadLettersResponse(
            dead_letters=[dead_letter_message(r) for r in rows],
            next_page_token=str(rows[-1]["id"]) if more else "",
        )

    async def ReplayDeadLetter(
        self, request: admin_pb2.ReplayDeadLetterRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ReplayDeadLetterResponse:
        """Queue the dead letter's job again (once); it passes the idempotency check."""
        identity = self._auth.require_ops(context)
        if request.id <= 0:
            raise InvalidArgument("id", "must be a positive dead letter id")
        try:
            async with self._sessions() as session, session.begin():
                replay = await replay_dead_letter(session, request.id)
                await audit.record(
                    session,
                    tenant_id="",
                    principal=audit.principal_of(identity),
                    action="dead_letter.replayed",
                    target_type="dead_letter",
                    target_id=str(request.id),
                    detail={"job_id": replay.job_id, "enqueued": replay.enqueued},
                )
        except DeadLetterNotFound as exc:
            raise NotFound(f"no dead letter {request.id}", reason="DEAD_LETTER_NOT_FOUND") from exc
        log.info(
            "dead_letter_replayed",
            dead_letter_id=request.id,
            job_id=replay.job_id,
            enqueued=replay.enqueued,
        )
        return admin_pb2.ReplayDeadLetterResponse(job_id=replay.job_id, enqueued=replay.enqueued)

    async def PurgeDeadLetters(
        self, request: admin_pb2.PurgeDeadLettersRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.PurgeDeadLettersResponse:
        """Delete dead letters (of one job type, dead before older_than)."""
        identity = self._auth.require_ops(context)
        older_than = None
        if request.HasField("older_than"):
            older_than = request.older_than.ToDatetime(tzinfo=UTC)
        async with self._sessions() as session, session.begin():
            purged = await purge_dead_letters(
                session, job_type=request.job_type, older_than=older_than
            )
            await audit.record(
                session,
                tenant_id="",
                principal=audit.principal_of(identity),
                action="dead_letters.purged",
                target_type="dead_letters",
                target_id=request.job_type or "*",
                detail={
                    "purged": purged,
                    "older_than": older_than.isoformat() if older_than else "",
                },
            )
        log.info("dead_letters_purged", purged=purged, job_type=request.job_type)
        return admin_pb2.PurgeDeadLettersResponse(purged=purged)

    async def ListAuditEvents(
        self, request: admin_pb2.ListAuditEventsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListAuditEventsResponse:
        """The audit trail newest first, filtered; page_token is the last id seen."""
        self._auth.require_ops(context)
        q = audit_query(request)
        async with self._sessions() as session:
            rows = await audit.query(session, q)
        size = q.limit - 1
        more = len(rows) > size
        rows = rows[:size]
        return admin_pb2.ListAuditEventsResponse(
            events=[audit_event_message(r) for r in rows],
            next_page_token=str(rows[-1]["id"]) if more else "",
        )
