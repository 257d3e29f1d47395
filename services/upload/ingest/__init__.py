"""Ingest: upload sessions and their chunks, up to the moment a merge is due.

Invariants kept here (docs/architecture.md):
1. a chunk is `(upload_id, chunk_index)`: a retry with the same checksum is a no-op, another
   checksum or size is `CHUNK_CONFLICT` and the stored chunk is untouched (`chunks`);
2. `received_chunk_count` grows only when an index is stored for the first time
   (`chunk_commits`, the group commit);
3. the request that completes the set wins `uploading -> merging` once and enqueues the one
   merge job in the same transaction (`chunk_commits`, through `uploads.MergeEnqueuer`);
5. status only moves forward; `aborted` and `expired` only from `uploading` (`uploads`,
   `expiry`).

Face: `Uploads` (sessions: create, read, abort, list), `ChunkStore` (store one chunk),
`MergeEnqueuer` (what the merge domain hands in), `expiry_handler`. Ingest sits below merge:
it never imports it.
"""
