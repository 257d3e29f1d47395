"""Keeping large request buffers in the heap: glibc malloc thresholds for a server process.

Why: a 4 MiB chunk passes through fresh buffers in the upload process (the bytes gRPC
received, the parsed message, the `bytes` the chunk path takes out of it). With glibc's
defaults a buffer that size is mapped fresh and unmapped when freed, or freed memory at
the heap's top goes back to the OS at once, so the next chunk faults ~1,000 pages in
again -- for the copy out of the message, on the event loop. Measured (bench_upload.py's
servers, 4 parallel PutChunk, 1 GiB): the loop thread's system time went from 2-4 ms a
chunk to 0.3-0.8, and the whole process's CPU per chunk from 11-17 ms to 8-10.

The two settings only work together: buffers up to `MMAP_THRESHOLD` come from the heap
(not a private mapping each), and up to `retain` bytes of freed heap stay mapped for reuse
instead of being trimmed. Either alone measured worse than glibc's defaults (setting one
turns off glibc's adaptive thresholds). The cost: a process keeps the memory of its recent
peak (at most `retain` bytes above what is in use) instead of shrinking after it.

Process-wide and glibc's: `python -m services.<name>` applies it once at start-up; where
`mallopt` does not exist (musl, macOS) nothing changes and the start says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc refuses a larger mmap threshold on 64-bit (HEAP_MAX_SIZE / 2).
MMAP_THRESHOLD = 32 * 1024 * 1024


def retain_freed_memory(retain: int) -> bool:
    """Serve buffers up to `MMAP_THRESHOLD` from the heap and keep up to `retain` bytes of
    freed heap for reuse; False (nothing changed) where glibc's `mallopt` is missing or
    refuses. `retain` 0 leaves glibc's defaults alone (returns False)."""
    if retain <= 0:
        return False
    mallopt = getattr(ctypes.CDLL(ctypes.util.find_library("c")), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # The trim threshold first: alone it is harmless; the mmap threshold alone is not.
    if mallopt(M_TRIM_THRESHOLD, retain) != 1:
        return False
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
