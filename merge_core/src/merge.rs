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
//! This file holds the merge itself and the hasher loop; the options are
//! `options.rs`, the feeder `merge_feeder.rs`, the windows it hands over
//! `window.rs`, its messages to the hasher `messages.rs`, the failure
//! ordering `failure.rs`, the fused checksum pair `pair_hasher.rs`, the
//! output writes `writer.rs`.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, TryRecvError};
use std::time::Instant;

use crate::checksum::Algorithm;
use crate::chunk::{order_chunks, Chunk};
use crate::errors::MergeError;
use crate::failure::Failure;
pub use crate::handover::{ChunkHashing, MergeStats};
use crate::handover::{Planner, Split};
use crate::merge_feeder::Feeder;
use crate::messages::Msg;
pub use crate::options::{MergeOptions, DROP_BEHIND_FROM};
use crate::output::TempOutput;
use crate::pair_hasher::PairHasher;
use crate::pool::Pool;
use crate::window::window_size;
use crate::writer::Writer;

/// What a successful merge produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergeOutcome {
    pub output_path: PathBuf,
    pub size: u64,
    pub checksum: String,
    pub algorithm: Algorithm,
    pub chunk_count: u64,
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

    let failure = Failure::new();
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
