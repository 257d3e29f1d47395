"""The audit trail: who changed which access or content, when, under which correlation id.

One row per change, written in the change's own transaction (`trail.record`); queried by
operators through `serentak.admin.v1.AdminService/ListAuditEvents`; purged past
`audit_retention_seconds` by the runtime's retention job (`jobs/retention.py`).
"""

from services.common.audit.trail import SYSTEM, AuditQuery, principal_of, query, record

__all__ = ["SYSTEM", "AuditQuery", "principal_of", "query", "record"]
