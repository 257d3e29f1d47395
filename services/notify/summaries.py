"""What an event says to a person: the file it is about, its name, a one-line summary.

Also decides which event types a digest may fold together: only those whose latest
event fully states the current situation (a rename, a move). Content changes, deletes,
restores and shares are never folded, so every such version stays visible.
"""

from __future__ import annotations

from dataclasses import dataclass

from serentak.events.v1 import events_pb2

# Event types whose newest event supersedes the earlier ones of a burst.
DIGESTIBLE_PAYLOADS = frozenset({"file_renamed", "file_moved"})


# The payload field naming the file (or folder) each kind of event is about.
_SUBJECT_FIELDS = {
    "file_content_updated": "file_id",
    "file_renamed": "file_id",
    "file_moved": "file_id",
    "file_deleted": "file_id",
    "file_restored": "file_id",
    "file_shared": "file_id",
    "file_unshared": "file_id",
    "folder_created": "folder_id",
    "file_purged": "file_id",
}


def named_subject(event: events_pb2.Event) -> tuple[str, str] | None:
    """The payload field naming what `event` is about (`kind.field`) and its value; None
    when the payload names nothing (no payload, or that field empty)."""
    kind = event.WhichOneof("payload")
    field = _SUBJECT_FIELDS.get(kind or "")
    if kind is None or field is None:
        return None
    value = getattr(getattr(event, kind), field)
    return (f"{kind}.{field}", value) if value else None


@dataclass(frozen=True, slots=True)
class Description:
    """The person-facing view of one event."""

    file_id: str
    file_name: str
    summary: str
    digestible: bool


def describe(event: events_pb2.Event) -> Description:
    """Describe `event`; unknown or absent payloads fall back to the envelope."""
    actor = event.actor_user_id or "someone"
    kind = event.WhichOneof("payload")
    name, summary = "", f"{actor}: {event.event_type}"
    if kind == "file_content_updated":
        p = event.file_content_updated
        name = p.name
        summary = f"{actor} updated {name}"
    elif kind == "file_renamed":
        r = event.file_renamed
        name = r.new_name
        summary = f"{actor} renamed a file to {name}"
    elif kind == "file_moved":
        m = event.file_moved
        name = m.name
        summary = f"{actor} moved {name}"
    elif kind == "file_deleted":
        d = event.file_deleted
        name = d.name
        summary = f"{actor} deleted {name}"
    elif kind == "file_restored":
        s = event.file_restored
        name = s.name
        summary = f"{actor} restored {name}"
    elif kind == "file_shared":
        sh = event.file_shared
        name = sh.name
        # A batch (ShareFileBatch) names its one user, or how many it reached.
        with_whom = sh.user_id or (
            sh.grants[0].user_id if len(sh.grants) == 1 else f"{len(sh.grants)} people"
        )
        summary = f"{actor} shared {name} with {with_whom}"
    elif kind == "file_unshared":
        u = event.file_unshared
        name = u.name
        summary = f"{actor} stopped sharing {name} with {u.user_id}"
    elif kind == "folder_created":
        f = event.folder_created
        name = f.name
        summary = f"{actor} created the folder {name}"
    subject = named_subject(event)
    file_id = subject[1] if subject is not None else event.aggregate_id
    return Description(file_id, name, summary, kind in DIGESTIBLE_PAYLOADS)
