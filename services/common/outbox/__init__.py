"""The transactional outbox: record events in the caller's transaction, relay them in order."""

from services.common.outbox.relay import Relay
from services.common.outbox.store import record_event
from services.common.outbox.subscribers import GrpcIngestSubscriber, Subscriber

__all__ = ["GrpcIngestSubscriber", "Relay", "Subscriber", "record_event"]
