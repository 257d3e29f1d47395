//! The ordered, verified merge (invariant 4).
//!
//! Two threads over a bounded stream of windows (parts of chunk files):
//!
//! ```text
//!   feeder (spawned): open chunk, check size, mmap a window (or read() it
//!        │            into a pool buffer), write it to the temporary file,
//!        │            and, for some chunks, hash it into the chunk's checksum
//!        │ the same window, bounded by `blocks`
//!        └──> hasher (calling thread): whole-file checksum (+ the chunk's
//!                                      when the feeder left it), chunk checks,
//!                                      progress
//! ```
//!
//! The per-chunk and whole-file checksums are two sha256 streams over the
//! same bytes. The whole-file stream is sequential, so it bounds the merge at
//! one core's hash rate. The per-chunk streams go wherever there is CPU left
//! (`handover.rs`; `ChunkHashing::Adaptive`, the default with two or more
//! cores): the calling thread fuses a chunk's stream with the whole-file
//! stream (`sha256x2`: the two round chains interleaved, one message
//! schedule, ~0.6x the cost of two separate streams), unless the feeder has
//! measured spare time (waiting on a full queue, with no CPU contention) to
//! hash that chunk itself. With one core everything is fused on the calling
//! thread, leaving the feeder only its
//! reading and writing. By default chunks are read() into private pool
//! buffers, so what is written is exactly what was hashed whatever happens
//! to the files, and a failing disk is an error, not a signal. With
//! `mmap: true` chunk files are mapped instead: the only user-space touch of
//! the bytes is then the hash (no read() copy), and the bytes written are the
//! mapped pages that are hashed, the same bytes as long as no one modifies a
//! chunk file in place during the merge; but an I/O error on a mapped page, or
//! a file truncated while mapped, raises SIGBUS, which kills the process. On
//! this project's VM reading costs no time against mapping (merge_core
//! README, "What was tried": 1.00-1.04x, alternating runs).
//! The output is a temporary file beside `output_path`, renamed into place
//! only after every check passed.
//!
//! This file holds the options, the hasher loop and the failure ordering;
//! the feeder is `merge_feeder.rs`, the fused checksum pair `pair_hasher.rs`,
//! the output writes `writer.rs`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::aligned::PAGE;
use crate::checksum::Algorithm;
use crate::chunk::{order_chunks, Chunk};
use crate::errors::MergeError;
pub use crate::handover::{ChunkHashing, MergeStats};
use crate::handover::{Planner, Split};
use crate::merge_feeder::{window_size, Bytes, Feeder};
use crate::output::TempOutput;
use crate::pair_hasher::PairHasher;
use crate::pool::Pool;
use crate::writer::Writer;

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

/// What a successful merge produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergeOutcome {
    pub output_path: PathBuf,
    pub size: u64,
    pub checksum: String,
    pub algorithm: Algorithm,
    pub chunk_count: u64,
}

pub(crate) enum Msg {
    /// Bytes of the current chunk, already written to the output, and
    /// whether the feeder already hashed them into the chunk's checksum.
    Data(Bytes, bool),
    /// All bytes of the chunk at this position (in index order) were sent,
    /// with the chunk's checksum if the feeder computed it.
    ChunkEnd(usize, Option<String>),
    /// The chunk at this position failed (or the output write failed while
    /// copying it); nothing follows.
    Fail(usize, MergeError),
}

/// The first failure by chunk position, so the error reported does not
/// depend on thread timing: the lowest failing chunk wins.
pub(crate) struct Failure {
    abort: AtomicBool,
    first: Mutex<Option<(usize, MergeError)>>,
}

impl Failure {
    pub(crate) fn record(&self, position: usize, err: MergeError) {
        self.abort.store(true, Ordering::Release);
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        if first.as_ref().is_none_or(|(p, _)| position < *p) {
            *first = Some((position, err));
        }
    }

    pub(crate) fn aborted(&self) -> bool {
        self.abort.load(Ordering::Acquire)
    }

    fn take(&self) -> Option<MergeError> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).take().map(|(_, e)| e)
    }
}

/// Merges `chunks` in index order into `output_path`.
///
/// `progress(bytes_done, bytes_total)` is called from this thread at start,
/// at most once per `progress_interval` while merging, and at the end;
/// returning `false` stops the merge with `MergeError::Interrupted`. On any
/// error the temporary file is removed and nothing appears at `output_path`.
pub fn merge(
    chunks: Vec<Chunk>,
    output_path: &Path,
    options: &MergeOptions,
    progress: &mut dyn FnMut(u64, u64) -> bool,
) -> Result<MergeOutcome, MergeError> {
    let algorithm = options.algorithm;
    let expected_file = match &options.expected_checksum {
        Some(hex) => Some(algorithm.normalize_hex(hex)?),
        None => None,
    };
    let chunks = order_chunks(chunks, algorithm)?;
    let total: u64 = chunks.iter().map(|c| c.size).sum();

    let output = TempOutput::create_beside(output_path)?;
    if options.preallocate {
        output.preallocate(total)?;
    }

    let failure = Failure { abort: AtomicBool::new(false), first: Mutex::new(None) };
    let blocks = options.blocks.max(2);
    // Windows alive at once: `blocks - 2` queued, one being written, one
    // being hashed. Read mode also bounds them by its pool.
    let (tx, rx) = sync_channel::<Msg>(blocks - 2);
    let split = Split::new(options.chunk_hashing, blocks - 2);

    let file_checksum = std::thread::scope(|scope| {
        let feeder = {
            let (chunks, output, failure, split) = (&chunks, &output, &failure, &split);
            scope.spawn(move || {
                let pool = (!options.mmap).then(|| Pool::new(blocks, window_size(options)));
                let feeder = Feeder {
                    tx,
                    pool: pool.as_ref(),
                    out: Writer::new(output, options, total),
                    options,
                    failure,
                    planner: Planner::new(split),
                    stats: options.stats.as_deref(),
                };
                feeder.run(chunks)
            })
        };
        let file_checksum = if progress(0, total) {
            hash(rx, &chunks, total, options, &failure, &split, progress)
        } else {
            failure.record(usize::MAX, MergeError::Interrupted);
            drop(rx);
            String::new()
        };
        feeder.join().expect("feeder thread panicked");
        file_checksum
    });

    if let Some(err) = failure.take() {
        return Err(err);
    }
    if let Some(expected) = expected_file {
        if expected != file_checksum {
            return Err(MergeError::FileChecksumMismatch { expected, actual: file_checksum });
        }
    }
    output.commit(options.fsync)?;
    progress(total, total);
    Ok(MergeOutcome {
        output_path: output_path.to_path_buf(),
        size: total,
        checksum: file_checksum,
        algorithm,
        chunk_count: chunks.len() as u64,
    })
}

/// The hasher (the calling thread): hashes every window into the chunk's and
/// the whole file's checksum (fused, one core, for sha256), checks each
/// chunk's checksum at its end, records the first failure in chunk order and
/// reports progress. Returns the whole-file checksum.
fn hash(
    rx: Receiver<Msg>,
    chunks: &[Chunk],
    total: u64,
    options: &MergeOptions,
    failure: &Failure,
    split: &Split,
    progress: &mut dyn FnMut(u64, u64) -> bool,
) -> String {
    let mut hasher = PairHasher::new(options.algorithm);
    let stats = options.stats.as_deref();
    let (mut done, mut last_report) = (0u64, Instant::now());
    loop {
        let msg = match rx.try_recv() {
            Ok(msg) => msg,
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => {
                let started = Instant::now();
                let Ok(msg) = rx.recv() else { break };
                if let Some(stats) = stats {
                    MergeStats::add(&stats.caller_idle_ns, started.elapsed());
                }
                msg
            }
        };
        if failure.aborted() {
            break;
        }
        match msg {
            Msg::Data(bytes, chunk_hashed) => {
                split.received();
                let n = bytes.data().len() as u64;
                let started = Instant::now();
                if chunk_hashed {
                    hasher.update_file(bytes.data());
                } else {
                    hasher.update(bytes.data());
                }
                if let Some(stats) = stats {
                    MergeStats::add(&stats.caller_hash_ns, started.elapsed());
                }
                drop(bytes); // unmap (or free the buffer) right away
                done += n;
                if last_report.elapsed() >= options.progress_interval {
                    last_report = Instant::now();
                    if !progress(done, total) {
                        failure.record(usize::MAX, MergeError::Interrupted);
                        break;
                    }
                }
            }
            Msg::ChunkEnd(position, by_feeder) => {
                let chunk = &chunks[position];
                let actual = match by_feeder {
                    Some(hex) => hex,
                    None => hasher.finish_chunk(),
                };
                if actual != chunk.checksum {
                    let err = MergeError::ChunkChecksumMismatch {
                        index: chunk.index,
                        path: chunk.path.clone(),
                        expected: chunk.checksum.clone(),
                        actual,
                    };
                    failure.record(position, err);
                    break;
                }
            }
            Msg::Fail(position, err) => {
                failure.record(position, err);
                break;
            }
        }
    }
    hasher.finish_file()
}
