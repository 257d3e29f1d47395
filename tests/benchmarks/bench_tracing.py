# ruff: noqa: E402 - the script puts the repository on sys.path before importing it
"""What tracing costs a call: GetUpload calls/s with tracing off, on, and on unsampled.

    .venv/bin/python tests/benchmarks/bench_tracing.py [--quick] [--rounds N]

The upload service in-process (SQLite in a temp folder, dev auth), built three times in
one run, each then driven the same way: `concurrency` callers on one channel calling
GetUpload on an upload of their own for `seconds`. GetUpload is a real read (auth, one
query, the answer): the smallest whole call the service serves.

- off: the default, no provider (the baseline);
- on: every call a span, through the official grpc.aio server interceptor, with the
  correlation id recorded, batched by the SDK's BatchSpanProcessor and encoded to OTLP
  protobuf as the exporter would send it (then dropped: the network send, one call per
  512 spans, is left out);
- on, ratio 0: tracing installed but no trace sampled (SERENTAK_TRACE_SAMPLE_RATIO=0),
  the instrumentation's cost without recording.

Modes alternate over `rounds` rounds and each keeps its best; printed: calls/s per mode,
the µs a call costs more than off, and each mode's ratio to off.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "client"), str(REPO / "tests")]

import grpc
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler, TraceIdRatioBased
from serentak.upload.v1 import upload_pb2, upload_pb2_grpc
from support.services import running_app

from services.common import tracing
from services.common.jobs import RuntimeOptions
from services.common.logging import configure_logging
from services.upload.app import build_app
from services.upload.settings import UploadSettings
from services.upload.sync.settings import SyncSettings

MD = (("authorization", "Bearer dev-alice"),)


class _EncodeOnly(SpanExporter):
    """Encodes each batch to OTLP protobuf as OTLPSpanExporter does, then drops it."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        encode_spans(spans).SerializeToString()
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


async def calls_per_second(
    settings: UploadSettings, concurrency: int, seconds: float
) -> tuple[float, int]:
    """GetUpload calls/s of `concurrency` callers for `seconds`; and how many calls."""
    options = RuntimeOptions(node_id="bench", concurrency=1, poll_interval=1.0, stats_interval=60)
    app = build_app(settings, options, SyncSettings(webhook_port=0))
    async with running_app(app) as service:
        address = f"127.0.0.1:{service.app.bound_port}"
        async with grpc.aio.insecure_channel(address) as channel:
            stub = upload_pb2_grpc.UploadServiceStub(channel)
            ids = []
            for i in range(concurrency):
                up = await stub.CreateUpload(
                    upload_pb2.CreateUploadRequest(
                        new_file=upload_pb2.NewFileTarget(name=f"f{i}-{time.time_ns()}.bin"),
                        total_chunks=2,
                        total_size=2 << 20,
                        chunk_size=1 << 20,
                    ),
                    metadata=MD,
                )
                ids.append(up.upload_id)
            counts = [0] * concurrency

            async def caller(n: int, until: float) -> None:
                request = upload_pb2.GetUploadRequest(upload_id=ids[n])
                while time.perf_counter() < until:
                    await stub.GetUpload(request, metadata=MD)
                    counts[n] += 1

            warm = time.perf_counter() + min(1.0, seconds / 4)
            await asyncio.gather(*(caller(n, warm) for n in range(concurrency)))
            counts = [0] * concurrency
            started = time.perf_counter()
            await asyncio.gather(*(caller(n, started + seconds) for n in range(concurrency)))
            elapsed = time.perf_counter() - started
    return sum(counts) / elapsed, sum(counts)


async def main(quick: bool, rounds: int | None) -> None:
    configure_logging("bench", "console", "WARNING")
    seconds, default_rounds, concurrency = (2.0, 1, 4) if quick else (6.0, 3, 4)
    rounds = rounds or default_rounds
    modes: dict[str, Sampler | None] = {
        "off": None,
        "on": ParentBased(ALWAYS_ON),
        "on, ratio 0": ParentBased(TraceIdRatioBased(0.0)),
    }
    best: dict[str, float] = {}
    exported: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for mode, sampler in modes.items():
                settings = UploadSettings(
                    upload_database_url=f"sqlite+aiosqlite:///{tmp}/{r}-{len(best)}.db",
                    data_dir=Path(tmp) / "data",
                    publish_events=False,
                    migrate_on_start=True,
                    auth_mode="dev",
                )
                provider = exporter = None
                if sampler is not None:
                    exporter = _EncodeOnly()
                    provider = TracerProvider(
                        resource=Resource.create({"service.name": "serentak-upload"}),
                        sampler=sampler,
                    )
                    provider.add_span_processor(BatchSpanProcessor(exporter))
                tracing.install(provider)
                try:
                    rate, calls = await calls_per_second(settings, concurrency, seconds)
                finally:
                    tracing.install(None)
                    if provider is not None:
                        provider.shutdown()  # exports what is left
                best[mode] = max(best.get(mode, 0.0), rate)
                if exporter is not None:
                    exported[mode] = exporter.spans
                print(f"round {r + 1} {mode:>12}: {rate:8.0f} calls/s ({calls} calls)")
    base = best["off"]
    print(f"GetUpload, {concurrency} callers, best of {rounds} round(s) of {seconds:.0f} s:")
    for mode, rate in best.items():
        extra_us = (1 / rate - 1 / base) * 1e6 * concurrency
        spans = f", {exported[mode]} spans exported" if mode in exported else ""
        print(
            f"  {mode:>12}: {rate:8.0f} calls/s  ratio vs off x{rate / base:.3f}"
            f"  (+{extra_us:.0f} µs a call{spans})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3; quick 1)")
    args = parser.parse_args()
    asyncio.run(main(args.quick, args.rounds))
