"""An upload's trace, in-process with the SDK's in-memory exporter (upload and locks
services traced, SQLite and PostgreSQL): the PutChunk server spans and their blob writes;
the merge job continuing the trace of the PutChunk that enqueued it; under the job the
merge (and the blob store's), the file lock's hold (with the lock service's Hold, client
and server) and under it the version's commit; the outbox event stored in that commit's
trace. UploadFile: the same lock and commit under the caller's own trace."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from serentak.upload.v1 import upload_pb2
from sqlalchemy import select
from support.tracing import MemorySpans, ancestors, memory_spans, named, parent_of
from upload.upload_helpers import upload_completed

from services.common import tracing
from services.common.outbox.models import outbox_events

PUT_CHUNK = "/serentak.upload.v1.UploadService/PutChunk"
UPLOAD_FILE = "/serentak.upload.v1.UploadService/UploadFile"
HOLD = "/serentak.locks.v1.LockService/Hold"
CHUNK = 1024


@pytest.fixture(autouse=True)
def exporter() -> Iterator[MemorySpans]:
    """Tracing on before the services start (autouse: before `cluster` and its locks)."""
    with memory_spans() as spans:
        yield spans


def _ended(name: str) -> Callable[[tuple[ReadableSpan, ...]], bool]:
    """Whether a span called `name` has ended (the job's ends after the commit the
    client already sees)."""
    return lambda spans: bool(named(spans, name))


def _attr(span: ReadableSpan, key: str) -> object:
    assert span.attributes is not None
    return span.attributes.get(key)


def _ids(span: ReadableSpan) -> str:
    return f"{span.context.trace_id:032x}-{span.context.span_id:016x}"


@pytest.mark.parametrize(
    "settings_overrides",
    # The merge job run by a worker, or inline by the PutChunk that completes the set.
    [{}, {"inline_merge_max_bytes": 1 << 20}],
    ids=["worker", "inline"],
)
async def test_a_chunked_uploads_trace_runs_from_put_chunk_through_the_merge_job(
    cluster, sessions, exporter
) -> None:
    alice = cluster["alice"]
    alice.metadata = alice.md(**{"x-correlation-id": "trace-me"})
    done = await upload_completed(alice, os.urandom(CHUNK * 3), CHUNK, name="traced.bin")
    # The Hold spans end when the stream does, which may be after the job: the server's,
    # and the client's after it (it sees the stream's end last).
    spans = await exporter.wait_for(
        lambda s: (
            _ended("job upload.merge")(s)
            and {x.kind for x in named(s, HOLD)} >= {trace.SpanKind.SERVER, trace.SpanKind.CLIENT}
        )
    )

    puts = named(spans, PUT_CHUNK)
    assert len(puts) == 3
    assert all(s.kind == trace.SpanKind.SERVER for s in puts)
    assert all(_attr(s, tracing.CORRELATION_ATTRIBUTE) == "trace-me" for s in puts)
    # Each chunk's bytes were written under its PutChunk.
    writes = named(spans, "blob write")
    assert sorted(parent_of(spans, w).name for w in writes) == [PUT_CHUNK] * 3  # type: ignore[union-attr]

    # The job runs in a worker's task (or inline, after the group commit's task enqueued
    # it), yet continues the trace of the PutChunk that enqueued it.
    (job,) = named(spans, "job upload.merge")
    enqueued_by = parent_of(spans, job)
    assert enqueued_by in puts
    assert _attr(job, tracing.CORRELATION_ATTRIBUTE) == "trace-me"
    inline = cluster.settings.inline_merge_max_bytes > 0
    assert str(_attr(job, "serentak.worker_id")).endswith("/inline") == inline
    trace_id = job.context.trace_id

    (merge,) = named(spans, "upload merge")
    (blob_merge,) = named(spans, "blob merge")
    (hold,) = named(spans, "lock hold")
    (commit,) = named(spans, "upload commit_version")
    (job_commit,) = [s for s in named(spans, "job commit") if parent_of(spans, s) is job]
    assert parent_of(spans, merge) is job and parent_of(spans, blob_merge) is merge
    assert _attr(merge, "serentak.upload_id") == done.upload_id
    assert _attr(merge, "serentak.chunks") == 3
    assert parent_of(spans, hold) is job and parent_of(spans, job_commit) is job
    assert _attr(hold, "serentak.lock_key") == f"file:{done.file_id}"
    # The commit is made under the lock, with the lock's fencing token.
    assert parent_of(spans, commit) is hold
    assert _attr(commit, "serentak.fencing_token") == _attr(hold, "serentak.fencing_token")
    assert _attr(commit, "serentak.version") == done.file_version == 1
    # The merge ends before the lock is taken: the lock is not held during it.
    assert merge.end_time is not None and hold.start_time is not None
    assert merge.end_time <= hold.start_time

    # The lock service's side of the hold, in-process here: its Hold stream's client span
    # under the hold, and the server's span under that.
    client = [s for s in named(spans, HOLD) if s.kind == trace.SpanKind.CLIENT]
    server = [s for s in named(spans, HOLD) if s.kind == trace.SpanKind.SERVER]
    assert [parent_of(spans, s) for s in client] == [hold]
    assert [parent_of(spans, s) for s in server] == client
    # The Acquire went on the lock client's Session stream, which is not traced (it
    # carries every Acquire of the process, whichever trace opened it).
    assert not named(spans, "/serentak.locks.v1.LockService/Session")

    # One trace from the PutChunk to the commit.
    chain = [enqueued_by, job, merge, blob_merge, hold, commit, job_commit, *client, *server]
    assert {s.context.trace_id for s in chain if s is not None} == {trace_id}

    # The event the commit recorded carries the commit's trace to the outbox relay.
    async with sessions() as session:
        stored = (
            await session.execute(
                select(outbox_events.c.traceparent).where(
                    outbox_events.c.aggregate_id == done.file_id,
                    outbox_events.c.event_type == "file.content.updated",
                )
            )
        ).scalar_one()
    assert stored.startswith(f"00-{_ids(commit)}-")


async def test_upload_file_continues_the_callers_trace_to_the_commit(cluster, exporter) -> None:
    alice = cluster["alice"]
    trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    answer = await alice.uploads.UploadFile(
        upload_pb2.UploadFileRequest(
            new_file=upload_pb2.NewFileTarget(name="small.txt"), data=b"a small file"
        ),
        metadata=alice.md(traceparent=f"00-{trace_id}-{parent_id}-01"),
    )
    spans = await exporter.wait_for(_ended(UPLOAD_FILE))
    (call,) = [s for s in named(spans, UPLOAD_FILE) if s.kind == trace.SpanKind.SERVER]
    assert f"{call.context.trace_id:032x}" == trace_id
    assert call.parent is not None and f"{call.parent.span_id:016x}" == parent_id
    (commit,) = named(spans, "upload commit_version")
    # A new file's commit takes no lock: nobody can name the file before it commits.
    assert ancestors(spans, commit)[:1] == [UPLOAD_FILE]
    assert not named(spans, "lock hold")
    assert _attr(commit, "serentak.file_id") == answer.upload.file_id
    (write,) = named(spans, "blob write")
    assert parent_of(spans, write) is call


async def test_upload_file_commits_a_new_version_under_the_file_lock(cluster, exporter) -> None:
    alice = cluster["alice"]
    first = await alice.uploads.UploadFile(
        upload_pb2.UploadFileRequest(new_file=upload_pb2.NewFileTarget(name="v.txt"), data=b"1"),
        metadata=alice.metadata,
    )
    await alice.uploads.UploadFile(
        upload_pb2.UploadFileRequest(file_id=first.upload.file_id, data=b"2"),
        metadata=alice.metadata,
    )
    spans = await exporter.wait_for(lambda got: len(named(got, "upload commit_version")) == 2)
    commits = named(spans, "upload commit_version")
    (commit,) = [s for s in commits if _attr(s, "serentak.fencing_token")]  # the version's
    assert ancestors(spans, commit)[:2] == ["lock hold", UPLOAD_FILE]
    (hold,) = named(spans, "lock hold")
    assert _attr(hold, "serentak.fencing_token") == _attr(commit, "serentak.fencing_token")
