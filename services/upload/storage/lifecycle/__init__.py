"""Storage lifecycle: what the blob store holds that nothing needs any more is deleted.

- `chunks.py`: a completed upload's chunk blobs (rows stay to answer late retries), by
  the `upload.purge_chunks` job enqueued in the transaction that commits COMPLETED (so a
  retried merge, which only runs while the upload is `merging`, always still finds them).
- `sweep.py`: the periodic `upload.reclaim` job: failed uploads' chunks and merge output
  after a grace period, superseded versions past the retention policy, and orphans (blobs
  no row refers to, and abandoned temp files such as a SIGKILLed merge's `*.merge-tmp`)
  older than their grace period.

Every deletion counts its bytes in serentak_upload_bytes_reclaimed_total{kind}.
"""

from services.upload.storage.lifecycle.chunks import (
    PURGE_CHUNKS_JOB,
    enqueue_chunk_purge,
    purge_chunks_handler,
)
from services.upload.storage.lifecycle.sweep import (
    RECLAIM_JOB,
    ReclaimPolicy,
    reclaim,
    reclaim_handler,
    reclaim_schedule,
)

__all__ = [
    "PURGE_CHUNKS_JOB",
    "RECLAIM_JOB",
    "ReclaimPolicy",
    "enqueue_chunk_purge",
    "purge_chunks_handler",
    "reclaim",
    "reclaim_handler",
    "reclaim_schedule",
]
