"""The audit trail's table: who changed what access or content, when, under which call.

It shares the runtime's `MetaData` (one migration folder, `runtime_migrations/`), so every
service that embeds the job runtime has it, and a change and its audit row always live in
the same database (one transaction).
"""

from __future__ import annotations

from sqlalchemy import JSON, Column, Index, String, Table

from services.common.jobs.models import Id, UtcDateTime, metadata

audit_events = Table(
    "audit_events",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("at", UtcDateTime, nullable=False),
    # "" for operator actions that belong to no tenant (dead-letter replays and purges).
    Column("tenant_id", String(64), nullable=False),
    # A user id, or "service:{name}" for a service principal (an operator's `ops`).
    Column("principal", String(140), nullable=False),
    Column("action", String(64), nullable=False),
    Column("target_type", String(32), nullable=False),
    Column("target_id", String(255), nullable=False),
    Column("correlation_id", String(128), nullable=False),
    # What the action needs to be understood (a grantee and role, a version, a count).
    Column("detail", JSON, nullable=False),
    # The queries: a tenant's, a user's, a file's trail in time order; retention by time.
    Index("ix_audit_events_tenant_id_at", "tenant_id", "at"),
    Index("ix_audit_events_principal_at", "principal", "at"),
    Index("ix_audit_events_target_id_at", "target_id", "at"),
    Index("ix_audit_events_at", "at"),
)
