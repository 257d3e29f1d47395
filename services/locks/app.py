"""Assemble the lock service: etcd client, mutex, servicer, reaper, shutdown hooks."""

from __future__ import annotations

from serentak.locks.v1 import locks_pb2, locks_pb2_grpc

from services.common.auth import build_authenticator
from services.common.grpc_server import ServiceApp, Servicer
from services.common.rate_limits import Limiter, RateGate
from services.common.readiness import Probe
from services.common.security import server_security
from services.common.server_limits import server_limits
from services.locks.caps import TenantCaps
from services.locks.etcd_client import Etcd
from services.locks.etcd_connection import options_from_settings, warn_if_exposed
from services.locks.keys import KeySpace
from services.locks.lease_pool import LeasePool
from services.locks.mutex import Mutex
from services.locks.rate_families import rate_policy
from services.locks.rate_store import EtcdCounterStore
from services.locks.reaper import LeaseReaper
from services.locks.servicer import LockServicer
from services.locks.settings import LocksSettings

# The etcd probe reads this (empty) range under the lock prefix, where etcd's RBAC lets
# the lock service read.
READINESS_SUFFIX = b"readiness-probe/"
SERVICE_NAME = locks_pb2.DESCRIPTOR.services_by_name["LockService"].full_name


def build_app(settings: LocksSettings) -> ServiceApp:
    """The lock service as a `ServiceApp` ready for `serve()` or `start()`.

    etcd is contacted lazily: the server starts (liveness SERVING) even when etcd is not
    up yet; readiness is NOT_SERVING and RPCs answer UNAVAILABLE / ETCD_UNAVAILABLE until
    it is.
    """
    probe_prefix = settings.lock_prefix.encode() + READINESS_SUFFIX
    try:
        options = options_from_settings(settings, settings.etcd_call_timeout_seconds)
        etcd = Etcd(options)  # reads the certificate files now: fail at start, not later
    except (ValueError, OSError) as exc:
        raise SystemExit(f"locks: etcd settings: {exc}") from None
    warn_if_exposed(options)
    reaper = LeaseReaper(etcd)
    keys = KeySpace(settings.lock_prefix)
    leases = LeasePool(etcd)
    mutex = Mutex(etcd, keys, reaper, leases)
    caps = TenantCaps(
        etcd, keys, settings.lock_max_held_per_tenant, settings.lock_max_waiters_per_tenant
    )
    auth = build_authenticator(settings)
    # Counted in etcd: the only store every replica of the lock service shares.
    window = settings.rate_limit_window_seconds
    rates = RateGate(
        rate_policy(settings),
        Limiter(
            EtcdCounterStore(etcd, settings.lock_prefix, window),
            service="locks",
            window_seconds=window,
            batch_max=settings.rate_limit_batch_max,
        ),
        auth,
    )
    servicer = LockServicer(
        mutex,
        settings.etcd_call_timeout_seconds,
        auth,
        caps,
        list_limit=settings.lock_list_limit,
        list_max=settings.lock_list_max,
        services=settings.lock_service_principals,
        max_hold_seconds=settings.lock_max_hold_seconds,
        session_max_in_flight=settings.lock_session_max_in_flight,
        rates=rates,
    )
    return ServiceApp(
        name="locks",
        host=settings.bind_host,
        port=settings.locks_port,
        metrics_port=settings.locks_metrics_port,
        servicers=[
            Servicer(locks_pb2_grpc.add_LockServiceServicer_to_server, servicer, SERVICE_NAME)
        ],
        background=[reaper.run],
        on_shutdown=[leases.close, etcd.close],
        # One range read (quorum): some member answers and the cluster has a leader.
        probes=[Probe("etcd", lambda: etcd.first_created(probe_prefix))],
        readiness_interval=settings.readiness_interval_seconds,
        readiness_timeout=settings.readiness_timeout_seconds,
        grace_seconds=settings.shutdown_grace_seconds,
        security=server_security(settings, auth),
        max_message_bytes=settings.locks_max_message_bytes,
        limits=server_limits(settings),
        rates=rates,
    )
