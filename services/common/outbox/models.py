"""Tables of the transactional outbox: outbox_events and relay_leases.

They share the runtime's `MetaData` with the job tables (one migration folder).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, LargeBinary, String, Table

from services.common.jobs.models import TRACEPARENT_LEN, Id, UtcDateTime, metadata

# `id` gives the publish order within an aggregate; `event_id` is the subscriber's dedupe key.
outbox_events = Table(
    "outbox_events",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("event_id", String(64), nullable=False, unique=True),
    Column("aggregate_type", String(64), nullable=False),
    Column("aggregate_id", String(255), nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("event_type", String(128), nullable=False),
    # The serialized serentak.events.v1.Event, exactly as it will be published.
    Column("event", LargeBinary, nullable=False),
    Column("correlation_id", String(128), nullable=False),
    # W3C traceparent of the span that recorded it, continued by the relay (runtime_0005).
    Column("traceparent", String(TRACEPARENT_LEN), nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("published_at", UtcDateTime, nullable=True),
    Index("ix_outbox_events_aggregate", "aggregate_type", "aggregate_id", "id"),
    Index("ix_outbox_events_published_at_id", "published_at", "id"),
)

# Who may publish an aggregate right now. A relay takes the row when it is absent or its
# lease has ended, so two replicas never publish the same aggregate at the same time.
relay_leases = Table(
    "relay_leases",
    metadata,
    Column("aggregate_key", String(330), primary_key=True),
    Column("holder", String(255), nullable=False),
    Column("lease_token", String(36), nullable=False),
    Column("expires_at", UtcDateTime, nullable=False),
)
