"""The notify service's RPC families and their limits (services/common/rate_limits/).

A Subscribe stream costs its call and every message it is sent (a batch is one message):
a stream refused mid-way ends RATE_LIMITED and the client resumes from its last cursor
after the RetryInfo delay, losing nothing. Ingest and IngestBatch are the upload relay's
(a service principal): never limited.
"""

from __future__ import annotations

from services.common.rate_limits import FamilyLimits, RatePolicy, Rule
from services.notify.settings import NotifySettings

SUBSCRIBE, ACKS, INBOX = "subscribe", "acks", "inbox"

RULES = {
    "Subscribe": Rule(SUBSCRIBE, messages=True),
    "MarkRead": Rule(ACKS),
    "ListNotifications": Rule(INBOX),
    "GetUnreadCount": Rule(INBOX),
}


def rate_policy(settings: NotifySettings) -> RatePolicy:
    """The notify service's limits as configured in `settings`."""
    return RatePolicy(
        service="notify",
        window_seconds=settings.rate_limit_window_seconds,
        families={
            SUBSCRIBE: FamilyLimits(
                settings.rate_limit_subscribe_per_user, settings.rate_limit_subscribe_per_tenant
            ),
            ACKS: FamilyLimits(
                settings.rate_limit_acks_per_user, settings.rate_limit_acks_per_tenant
            ),
            INBOX: FamilyLimits(
                settings.rate_limit_inbox_per_user, settings.rate_limit_inbox_per_tenant
            ),
        },
        rules=RULES,
    )
