"""A tenant's stored bytes (`tenant_usage`, kept by triggers on files) always equal the sum
its quota counts, whatever changed a file's size: new files, new versions, a restore, a
delete (the trash still counts), the trash purge; so the quota check reads one row
instead of summing every file of the tenant (services/upload/ingest/allowance.py)."""

from __future__ import annotations

import os
from datetime import timedelta

import grpc
import pytest
from serentak.upload.v1 import upload_pb2
from sqlalchemy import func, select
from support.grpc_errors import error_info
from upload.tree_helpers import folder
from upload.version_helpers import new_file, new_version, restore

from services.upload.files.trash import purge_trash
from services.upload.models import FILE, FileRow, TenantUsageRow, utcnow


async def _stored(sessions) -> tuple[int, int]:
    """(the trigger-kept figure, the sum it stands for) of tenant acme."""
    async with sessions() as session:
        kept = await session.scalar(
            select(TenantUsageRow.stored_bytes).where(TenantUsageRow.tenant_id == "acme")
        )
        summed = await session.scalar(
            select(func.coalesce(func.sum(FileRow.size), 0)).where(
                FileRow.tenant_id == "acme", FileRow.kind == FILE
            )
        )
    return int(kept or 0), int(summed)


async def test_stored_bytes_follow_every_change_of_a_files_size(cluster, sessions) -> None:
    alice = cluster["alice"]
    box = await folder(alice, "box")
    a = await new_file(alice, os.urandom(1000), "a.bin")
    b = await new_file(alice, os.urandom(3000), "b.bin")
    assert await _stored(sessions) == (4000, 4000)
    await new_version(alice, a.file.file_id, os.urandom(250))  # shrinks
    await restore(alice, a.file.file_id, 1)  # back to 1000 bytes as version 3
    assert await _stored(sessions) == (4000, 4000)
    await alice.files.MoveFile(
        upload_pb2.MoveFileRequest(file_id=b.file.file_id, new_parent_id=box),
        metadata=alice.metadata,
    )
    await alice.files.DeleteFile(upload_pb2.DeleteFileRequest(file_id=box), metadata=alice.metadata)
    assert await _stored(sessions) == (4000, 4000)  # the trash still counts
    purged = await purge_trash(sessions, timedelta(0), now=utcnow() + timedelta(days=1))
    assert purged.items >= 1
    assert await _stored(sessions) == (1000, 1000)


@pytest.mark.parametrize("settings_overrides", [{"tenant_quota_bytes": 5000}])
async def test_the_quota_counts_the_kept_figure(cluster, sessions) -> None:
    alice = cluster["alice"]
    await new_file(alice, os.urandom(4000), "big.bin")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await new_file(alice, os.urandom(2000), "more.bin")
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_info(refused.value).reason == "QUOTA_EXCEEDED"
    assert await _stored(sessions) == (4000, 4000)
