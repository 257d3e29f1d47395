"""How an upstream error on a drive-level job (the delta poll, a subscription operation)
becomes the job runtime's outcome, counted in the sync metrics.

Items have their own mapping in `sync_job.py` (404 retries with a bound, a tombstone on 410).
"""

from __future__ import annotations

from typing import NoReturn

from services.common.jobs.errors import PermanentError, RetryLater, TransientError
from services.upload.sync import metrics
from services.upload.sync.decisions import DeltaAction, decide_delta
from services.upload.sync.provider import UpstreamError


def raise_for_drive(exc: UpstreamError, where: str) -> NoReturn:
    """Raise RetryLater (throttled), TransientError or PermanentError for `exc`, `where`
    naming the operation in the message. A 410 here is not a cursor expiry handled by the
    caller but a confused provider, so it is retried as transient."""
    action = decide_delta(exc.status)
    if action is DeltaAction.RETRY_AFTER:
        metrics.RETRIES.labels("retry_after").inc()
        raise RetryLater(f"{where} throttled: {exc}", retry_after=exc.retry_after) from exc
    if action in (DeltaAction.RETRY_TRANSIENT, DeltaAction.FULL_RESYNC):
        metrics.RETRIES.labels("transient").inc()
        raise TransientError(f"{where}: {exc}") from exc
    if action is DeltaAction.FAIL_AUTH:
        metrics.AUTH_FAILURES.inc()
    metrics.DEAD_LETTERS.labels("auth" if action is DeltaAction.FAIL_AUTH else "permanent").inc()
    raise PermanentError(f"{where}: {exc}") from exc
