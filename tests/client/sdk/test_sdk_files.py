"""The SDK's file-tree calls (create_folder, move, rename, delete, restore, share by role
name) against the real services, and their results reading enums as names. Both DBs."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from serentak.sdk import FileKind, Role, UploadStatus
from serentak.sdk.results import rpc_reason
from serentak.upload.v1 import upload_pb2


async def test_folders_moves_deletes_and_shares(stack, tmp_path: Path) -> None:
    source = tmp_path / "notes.txt"
    source.write_bytes(b"notes")
    async with stack.client("dev-alice") as alice, stack.client("dev-bob") as bob:
        done = await alice.upload(source)
        assert done.status == UploadStatus.COMPLETED and str(done.status) == "completed"
        docs = await alice.create_folder("docs", client_request_id="mk-1")
        assert docs.kind == FileKind.FOLDER and docs.role == Role.OWNER and docs.name == "docs"
        # A retry (same request id) is the same folder; another request for the name is not.
        assert (await alice.create_folder("docs", client_request_id="mk-1")) == docs
        with pytest.raises(grpc.aio.AioRpcError) as taken:
            await alice.create_folder("docs")
        assert rpc_reason(taken.value)[0] == "NAME_TAKEN"

        moved = await alice.move(done.file_id, docs.file_id)
        assert moved.parent_id == docs.file_id and moved.kind == FileKind.FILE
        renamed = await alice.rename(done.file_id, "minutes.txt", expected_version=moved.version)
        assert renamed.name == "minutes.txt" and renamed.version > moved.version
        inside = await alice.list_folder(docs.file_id)
        assert [(f.name, str(f.kind)) for f in inside] == [("minutes.txt", "file")]

        gone = await alice.delete(done.file_id)
        assert gone.deleted and await alice.list_folder(docs.file_id) == []
        back = await alice.restore(done.file_id)
        assert not back.deleted and [f.file_id for f in await alice.list_folder(docs.file_id)]

        await alice.share(docs.file_id, "bob", "editor")
        assert [(c.user_id, str(c.role)) for c in await alice.collaborators(docs.file_id)] == [
            ("bob", "editor")
        ]
        shared = await bob.shared_with_me()
        assert [(s.file.file_id, s.role) for s in shared] == [(docs.file_id, Role.EDITOR)]
        with pytest.raises(ValueError, match="unknown role"):
            await alice.share(docs.file_id, "bob", "boss")
        completed = await alice.list_uploads("completed")
        assert [u.upload_id for u in completed] == [done.upload_id]
        assert completed[0].status == upload_pb2.UPLOAD_STATUS_COMPLETED


async def test_versions_download_a_version_and_restore_it(stack, tmp_path: Path) -> None:
    source = tmp_path / "plan.txt"
    source.write_bytes(b"plan A")
    async with stack.client("dev-alice") as alice, stack.client("dev-bob") as bob:
        first = await alice.upload(source)
        source.write_bytes(b"plan B, revised")
        await alice.upload(source, to_file_id=first.file_id)
        history = await alice.versions(first.file_id)
        assert [(v.version, v.current, v.kept) for v in history] == [
            (2, True, True),
            (1, False, True),
        ]
        assert str(history[0].checksum_algorithm) == "sha256" and history[1].size == 6
        seen: list[tuple[int, int]] = []
        got = await alice.download(
            first.file_id, tmp_path / "a.txt", version=1, progress=lambda d, t: seen.append((d, t))
        )
        assert (tmp_path / "a.txt").read_bytes() == b"plan A" and got.verified
        assert seen[0] == (0, 6) and seen[-1] == (6, 6)
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await alice.download(first.file_id, tmp_path / "b.txt", version=9)
        assert rpc_reason(missing.value)[0] == "VERSION_NOT_FOUND"
        assert not (tmp_path / "b.txt").exists()

        await alice.share(first.file_id, "bob", "viewer")
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await bob.restore_version(first.file_id, 1)
        assert rpc_reason(denied.value)[0] == "INSUFFICIENT_ROLE"
        done = await alice.restore_version(first.file_id, 1, client_request_id="back-to-a")
        assert (done.restored_from, done.file.version, done.version.version) == (1, 4, 4)
        assert done.file.role == Role.OWNER and done.version.author_user_id == "alice"
        retried = await alice.restore_version(first.file_id, 1, client_request_id="back-to-a")
        assert retried.version.upload_id == done.version.upload_id
        await alice.download(first.file_id, tmp_path / "now.txt")
        assert (tmp_path / "now.txt").read_bytes() == b"plan A"
        assert [v.version for v in await bob.versions(first.file_id)] == [4, 2, 1]
