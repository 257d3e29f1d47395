"""Storage: where chunk and file bytes live, and how what nothing needs is deleted.

`blob_store` is one interface with a backend per file (`local`, `s3`); keys are
`uploads/{upload_id}/{index}` for chunks and content keys for versions. `lifecycle` deletes
what no row needs any more (a completed upload's chunks, failed uploads, superseded
versions, orphans), always blobs first, then the row. `quota_use` gauges each tenant's use.

Face: `BlobStore`, `open_blob_store`, the key functions, `reclaim`, `QuotaUse`. Storage is
the lowest domain: it imports none of the others.
"""
