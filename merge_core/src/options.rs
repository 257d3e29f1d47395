//! How a merge runs: `MergeOptions` and its defaults.
//!
//! In a file of its own because the merge (`merge.rs`), its feeder
//! (`merge_feeder.rs`) and its writer (`writer.rs`) all read it; kept in
//! `merge.rs` it made those files import each other in a circle.

use std::sync::Arc;
use std::time::Duration;

use crate::aligned::PAGE;
use crate::checksum::Algorithm;
use crate::handover::{ChunkHashing, MergeStats};

/// How a merge runs. `Default` is what the Python API uses.
#[derive(Clone, Debug)]
pub struct MergeOptions {
    pub algorithm: Algorithm,
    /// Checksum the merged file must have (hex), if the caller knows it.
    pub expected_checksum: Option<String>,
    /// fsync the file and its directory (and start writeback while merging).
    pub fsync: bool,
    /// Map chunk files (`true`) rather than read() them into buffers (the
    /// default). Needs chunk files that are not modified or truncated during
    /// the merge; an I/O error on a mapped page is SIGBUS, not an error.
    pub mmap: bool,
    /// Size of each window (mapping or buffer) of a chunk file.
    pub block_size: usize,
    /// Windows in flight: memory (buffers, or mapped pages counted in RSS)
    /// is bounded by `blocks * block_size`.
    pub blocks: usize,
    /// Largest single `write()`.
    pub write_size: usize,
    /// With `fsync`, ask for writeback after this many bytes, so the disk
    /// works while we hash rather than all at the final fsync.
    pub writeback_every: u64,
    /// Write back and drop from the page cache (`POSIX_FADV_DONTNEED`) the
    /// output written more than this many bytes ago (0: never). Reusing the
    /// same few page-cache pages is far cheaper than taking fresh ones on
    /// this VM (~2x at 4 GiB); the output is then not cached afterwards.
    pub drop_behind: u64,
    /// Without `fsync`, use `drop_behind` only in merges of at least this
    /// many bytes (0: always; `u64::MAX`: never). A merged upload is cold
    /// data; dropping it behind the writer only starts its writeback sooner
    /// (nothing waits for it to be durable; `fsync: false` promises nothing
    /// more or less) and leaves it uncached. Below this size the output
    /// stays in the page cache, where small merges are cheapest.
    pub drop_behind_from: u64,
    /// Without `fsync`, wait for the dropped range's writeback (else drop
    /// only what is already clean, so the merge is not paced by the disk:
    /// the default). Durable merges always wait.
    pub drop_waits: bool,
    /// Least time between two progress reports.
    pub progress_interval: Duration,
    /// Reserve the output's size up front (`fallocate`), so a full disk fails
    /// before any work. Off by default: on ext4 it made page-cache merges ~4x
    /// slower (writes into unwritten extents).
    pub preallocate: bool,
    /// Which thread computes the per-chunk checksums.
    pub chunk_hashing: ChunkHashing,
    /// Where the time went (benchmarks, profiling); `None` in production.
    pub stats: Option<Arc<MergeStats>>,
}

/// Default `drop_behind_from`. README "Measured": at 4 GiB a page-cache
/// merge that drops behind was ~2x faster on this VM (which faults every
/// fresh page-cache page in from the host); at 1 GiB it was slightly slower.
pub const DROP_BEHIND_FROM: u64 = 2 << 30;

impl Default for MergeOptions {
    fn default() -> Self {
        MergeOptions {
            algorithm: Algorithm::Sha256,
            expected_checksum: None,
            fsync: true,
            mmap: false,
            block_size: 1 << 20,
            blocks: 8,
            write_size: 128 << 10,
            writeback_every: 4 << 20,
            drop_behind: 64 << 20,
            drop_behind_from: DROP_BEHIND_FROM,
            drop_waits: false,
            progress_interval: Duration::from_millis(250),
            preallocate: false,
            chunk_hashing: ChunkHashing::Auto,
            stats: None,
        }
    }
}

impl MergeOptions {
    /// The most memory the pipeline's windows take.
    pub fn buffer_budget(&self) -> usize {
        self.blocks.max(2) * self.block_size.max(PAGE).div_ceil(PAGE) * PAGE
    }
}
