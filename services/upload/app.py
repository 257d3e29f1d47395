"""Assemble the upload service: database, servicers, background work."""

from __future__ import annotations

import functools

from serentak.upload.v1 import upload_pb2, upload_pb2_grpc

from services.common.admin import admin_servicer
from services.common.grpc_server import ServiceApp, Servicer
from services.common.jobs.runtime import RuntimeOptions
from services.common.readiness import Probe, database_probe
from services.common.security import server_security
from services.common.server_limits import server_limits
from services.upload.audit import UploadAudit
from services.upload.components import UploadComponents, build_components
from services.upload.database import migration_locations, prepare
from services.upload.ingest.status_ages import sample_status_ages
from services.upload.servicer import FileServicer, UploadAdminServicer, UploadServicer
from services.upload.settings import UploadSettings
from services.upload.storage.quota_use import sample_quota_use
from services.upload.sync.settings import SyncSettings

# A key nothing is stored under: the blob store probe only asks whether it exists.
READINESS_PROBE_KEY = "readiness-probe"
_SERVICES = upload_pb2.DESCRIPTOR.services_by_name


def build_app(
    settings: UploadSettings,
    runtime_options: RuntimeOptions | None = None,
    sync_settings: SyncSettings | None = None,
) -> ServiceApp:
    """The upload service as a `ServiceApp`; migrates or checks its schema first."""
    return assemble(settings, runtime_options, sync_settings)[0]


def assemble(
    settings: UploadSettings,
    runtime_options: RuntimeOptions | None = None,
    sync_settings: SyncSettings | None = None,
) -> tuple[ServiceApp, UploadComponents]:
    """`build_app` and the parts it runs on (tests reach the tus endpoint's bound port)."""
    prepare(settings.database_url, migrate_on_start=settings.migrate_on_start)
    parts = build_components(settings, runtime_options, sync_settings)
    background = parts.runtime.background()
    background.append(
        functools.partial(sample_status_ages, parts.sessions, settings.metrics_sample_seconds)
    )
    background.append(
        functools.partial(
            sample_quota_use,
            parts.sessions,
            settings.tenant_quota_bytes,
            settings.metrics_sample_seconds,
        )
    )
    # A graceful stop first answers the GetUpload calls waiting for their upload.
    background.append(parts.signals.serve)
    if parts.sync.engine.settings.enabled:
        background.append(parts.sync.webhook_server)
    if parts.tus is not None:
        background.append(parts.tus.serve)
    app = ServiceApp(
        name="upload",
        host=settings.bind_host,
        port=settings.upload_port,
        metrics_port=settings.upload_metrics_port,
        servicers=[
            Servicer(
                upload_pb2_grpc.add_UploadServiceServicer_to_server,
                UploadServicer(
                    parts.auth,
                    parts.uploads,
                    parts.chunks,
                    parts.runtime.wake,
                    parts.upload_files,
                    parts.inline,
                    settings.inline_merge_max_bytes,
                    waits=parts.waits,
                ),
                _SERVICES["UploadService"].full_name,
            ),
            Servicer(
                upload_pb2_grpc.add_FileServiceServicer_to_server,
                FileServicer(parts.auth, parts.files, parts.restores, parts.changes),
                _SERVICES["FileService"].full_name,
            ),
            Servicer(
                upload_pb2_grpc.add_UploadAdminServiceServicer_to_server,
                UploadAdminServicer(
                    parts.auth,
                    UploadAudit(
                        parts.sessions, parts.blobs, default_sample=settings.audit_sample_size
                    ),
                ),
                _SERVICES["UploadAdminService"].full_name,
            ),
            # Queue stats and dead letters of the job runtime (service credential only).
            admin_servicer(parts.sessions, parts.auth),
            # Upstream sync (issue 8): linked drives, synced items, tombstones.
            parts.sync.servicer,
        ],
        background=background,
        on_shutdown=[parts.close],
        probes=[
            database_probe("upload", parts.engine, migration_locations()),
            # One HEAD (S3) or stat (local): reachable, credentials and bucket accepted.
            Probe("blob_store", lambda: parts.blobs.exists(READINESS_PROBE_KEY)),
        ],
        readiness_interval=settings.readiness_interval_seconds,
        readiness_timeout=settings.readiness_timeout_seconds,
        grace_seconds=settings.shutdown_grace_seconds,
        max_message_bytes=settings.max_message_bytes,
        security=server_security(settings, parts.auth),
        limits=server_limits(settings),
        rates=parts.rates,
    )
    return app, parts
