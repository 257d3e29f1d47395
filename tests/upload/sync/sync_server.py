"""SyncService and the upload service's real FileService on one loopback gRPC server."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from serentak.upload.v1 import sync_pb2, sync_pb2_grpc, upload_pb2, upload_pb2_grpc
from support.services import running_app
from upload.sync.sync_world import SyncWorld

from services.common.auth import Authenticator
from services.common.grpc_server import ServiceApp, Servicer
from services.common.page_tokens import PageTokens
from services.upload.files.listing_cache import ListingCache
from services.upload.files.use_cases import Files
from services.upload.servicer import FileServicer
from services.upload.storage.blob_store import LocalBlobStore
from services.upload.sync.engine import SyncEngine
from services.upload.sync.servicer import SyncServicer

ALICE = (("authorization", "Bearer dev-alice"),)
BOB = (("authorization", "Bearer dev-bob"),)
MALLORY = (("authorization", "Bearer dev-mallory"),)


@contextlib.asynccontextmanager
async def sync_server(
    world: SyncWorld, tmp_path: Path, engine: SyncEngine | None = None
) -> AsyncIterator[grpc.aio.Channel]:
    """A channel to SyncService (over `engine`, default the world's) and FileService."""
    auth = Authenticator.dev()
    services = upload_pb2.DESCRIPTOR.services_by_name
    files = Files(
        world.sessions,
        LocalBlobStore(tmp_path / "blobs", fsync=False),
        ListingCache(64),
        PageTokens("sync-tests-page-token-secret"),
    )
    app = ServiceApp(
        name="upload-sync-test",
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        servicers=[
            Servicer(
                sync_pb2_grpc.add_SyncServiceServicer_to_server,
                SyncServicer(engine or world.engine, auth),
                sync_pb2.DESCRIPTOR.services_by_name["SyncService"].full_name,
            ),
            Servicer(
                upload_pb2_grpc.add_FileServiceServicer_to_server,
                FileServicer(auth, files),
                services["FileService"].full_name,
            ),
        ],
    )
    async with running_app(app) as svc:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.app.bound_port}") as ch:
            yield ch
