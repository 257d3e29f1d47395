"""A real upload process (`services.upload` run by `support.services.service_process`) for
tests that read its JSON log, or kill it mid-merge and restart it on the same data and
database."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace

import grpc
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from support.services import ServiceProcess, service_process
from upload.upload_helpers import DEADLINE_S, wait_status

ALICE = (("authorization", "Bearer dev-alice"),)


def upload_env(database_url: str, locks_address: str, **settings: str) -> dict[str, str]:
    """The environment of an upload process on `database_url` with a fast job worker, JSON
    logs and every merge on the job path; `settings` adds SERENTAK_* variables
    (`worker_lease_seconds="2"`)."""
    return {
        "SERENTAK_UPLOAD_DATABASE_URL": database_url,
        "SERENTAK_LOCKS_ADDRESS": locks_address,
        "SERENTAK_MIN_CHUNK_SIZE": "1024",
        "SERENTAK_WORKER_POLL_SECONDS": "0.1",
        "SERENTAK_LOG_FORMAT": "json",
        # Any free port: the default 8181 may be taken by another service on the host.
        "SERENTAK_SYNC_WEBHOOK_PORT": "0",
        # These processes are killed mid-merge on the job path; small uploads would merge
        # inside the completing PutChunk instead (its crash test: merge/test_upload_file_crash.py).
        "SERENTAK_INLINE_MERGE_MAX_BYTES": "0",
        **{f"SERENTAK_{name.upper()}": value for name, value in settings.items()},
    }


@contextlib.asynccontextmanager
async def upload_process(
    tmp_path, env: dict[str, str]
) -> AsyncIterator[tuple[ServiceProcess, upload_pb2_grpc.UploadServiceStub]]:
    """Run the upload service (data under `tmp_path`) and yield it with a stub on a channel
    to it; stopped (SIGTERM) on exit unless the test killed it."""
    with contextlib.ExitStack() as stack:
        proc = await asyncio.to_thread(
            stack.enter_context, service_process("upload", tmp_path, env)
        )
        async with grpc.aio.insecure_channel(proc.address) as channel:
            yield proc, upload_pb2_grpc.UploadServiceStub(channel)


def kill(proc: ServiceProcess) -> None:
    """SIGKILL the process, as a crash, and reap it."""
    proc.process.send_signal(signal.SIGKILL)
    proc.process.wait()


async def wait_completed(
    stub: upload_pb2_grpc.UploadServiceStub,
    upload_id: str,
    metadata=ALICE,
    deadline_s: float = DEADLINE_S,
) -> upload_pb2.Upload:
    """The upload once it is COMPLETED; fails after `deadline_s` (`wait_status`)."""
    client = SimpleNamespace(uploads=stub, metadata=metadata)
    return await wait_status(
        client, upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED, deadline_s=deadline_s
    )


async def wait_for(predicate: Callable[[], object], what: Callable[[], str], limit_s=30.0):
    """Poll `predicate` (an observable condition) until true; fail with `what()` after
    `limit_s` seconds."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, what()
        await asyncio.sleep(0.05)
