"""Merge: a complete set of chunks becomes the file's next version, exactly once.

The merge job (`merge_job`) verifies indexes `0..N-1`, merges through `merge_core` (ordered,
every chunk's and the whole file's checksum checked while streaming, temp file renamed
atomically: invariant 4), takes the file's lock (`file_locks`, through the client's one
lock-hold client) and commits size, checksum and version with the fencing check
(`files.versions`, invariant 7) and its outbox event (invariant 6). `stuck_merges` fails
uploads left `merging` behind a dead merge job.

Face: `MergeHandler`, `enqueue_merge`, `MERGE_JOB`, `FileLocks`, `fail_dead_merges`.
"""
