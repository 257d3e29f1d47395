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
//! mapping and writing. By default chunk files are mapped, not read, so the only
//! user-space touch of the bytes is the hash (plus the kernel's copy into the
//! output's page cache by `write()`): no read() copy. The bytes written are
//! the mapped pages that are hashed, which is the same bytes as long as no
//! one modifies a chunk file in place during the merge; Serentak's chunk
//! files are immutable (written to a temporary name and renamed). With
//! `mmap: false` chunks are read() into private pool buffers, so what is
//! written is exactly what was hashed whatever happens to the files.
//! The output is a temporary file beside `output_path`, renamed into place
//! only after every check passed.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::aligned::PAGE;
use crate::checksum::{Algorithm, Hasher};
use crate::chunk::{order_chunks, Chunk};
use crate::errors::MergeError;
pub use crate::handover::{ChunkHashing, MergeStats};
use crate::handover::{Planner, Split};
use crate::output::TempOutput;
use crate::pool::{Block, Pool};
use crate::sha256x2::{self, Sha256Stream};
use crate::writer::Writer;

/// How a merge runs. `Default` is what the Python API uses.
#[derive(Clone, Debug)]
pub struct MergeOptions {
    pub algorithm: Algorithm,
    /// Checksum the merged file must have (hex), if the caller knows it.
    pub expected_checksum: Option<String>,
    /// fsync the file and its directory (and start writeback while merging).
    pub fsync: bool,
    /// Map chunk files (`true`) rather than read() them into buffers. Needs
    /// chunk files that are not modified or truncated during the merge.
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
            mmap: true,
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

enum Msg {
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
struct Failure {
    abort: AtomicBool,
    first: Mutex<Option<(usize, MergeError)>>,
}

impl Failure {
    fn record(&self, position: usize, err: MergeError) {
        self.abort.store(true, Ordering::Release);
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        if first.as_ref().is_none_or(|(p, _)| position < *p) {
            *first = Some((position, err));
        }
    }

    fn aborted(&self) -> bool {
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

/// The feeder (a spawned thread): opens each chunk in order, checks its size,
/// maps (or reads) it a window at a time, writes each window to the temporary
/// file and then hands it to the hasher. Chunk errors and write errors travel
/// in order with the data (`Msg::Fail`), so the hasher reports the lowest
/// failing chunk even though the feeder runs ahead of it.
struct Feeder<'a> {
    tx: SyncSender<Msg>,
    pool: Option<&'a Pool>,
    out: Writer<'a>,
    options: &'a MergeOptions,
    failure: &'a Failure,
    planner: Planner<'a>,
    stats: Option<&'a MergeStats>,
}

impl Feeder<'_> {
    fn run(mut self, chunks: &[Chunk]) {
        for (position, chunk) in chunks.iter().enumerate() {
            if self.failure.aborted() {
                return;
            }
            let takes = self.planner.feeder_takes(chunk.size, self.stats);
            if let Some(stats) = self.stats {
                stats.chunks.fetch_add(1, Ordering::Relaxed);
                stats.chunks_by_feeder.fetch_add(takes as u64, Ordering::Relaxed);
            }
            let mut hasher = takes.then(|| Hasher::new(self.options.algorithm));
            match self.feed_chunk(chunk, hasher.as_mut()) {
                Ok(true) => {}
                Ok(false) => return,
                Err(err) => {
                    let _ = self.tx.send(Msg::Fail(position, err));
                    return;
                }
            }
            if !self.send(Msg::ChunkEnd(position, hasher.map(Hasher::finalize_hex))) {
                return;
            }
        }
        self.out.finish();
    }

    /// Queues `msg` for the hasher, timing any wait for room (the feeder's
    /// idle time, which `Planner` spends on chunk checksums); `false` if the
    /// hasher stopped.
    fn send(&mut self, msg: Msg) -> bool {
        match self.tx.try_send(msg) {
            Ok(()) => true,
            Err(TrySendError::Disconnected(_)) => false,
            Err(TrySendError::Full(msg)) => {
                let started = Instant::now();
                let sent = self.tx.send(msg).is_ok();
                let waited = started.elapsed();
                self.planner.idled(waited);
                if let Some(stats) = self.stats {
                    MergeStats::add(&stats.feeder_idle_ns, waited);
                }
                sent
            }
        }
    }

    /// One chunk through the feeder (hashed into `hasher` too, if given);
    /// `Ok(false)`: stop quietly (the hasher stopped, or a failure was
    /// recorded elsewhere).
    fn feed_chunk(&mut self, chunk: &Chunk, mut hasher: Option<&mut Hasher>) -> Result<bool, MergeError> {
        let (options, failure, pool) = (self.options, self.failure, self.pool);
        let io_err = |op, e| MergeError::io(Some(chunk.index), &chunk.path, op, e);
        let size_err = |actual| MergeError::ChunkSizeMismatch {
            index: chunk.index,
            path: chunk.path.clone(),
            expected: chunk.size,
            actual,
        };
        let mut file = File::open(&chunk.path).map_err(|e| io_err("open", e))?;
        let actual = file.metadata().map_err(|e| io_err("stat", e))?.len();
        if actual != chunk.size {
            return Err(size_err(actual));
        }
        let fd = file.as_raw_fd();
        // SAFETY: advisory syscall on an fd we own.
        unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_SEQUENTIAL) };
        let window = window_size(options);
        let mut use_map = pool.is_none();
        let mut own_pool: Option<Pool> = None;
        let mut offset = 0u64;
        while offset < chunk.size {
            if failure.aborted() {
                return Ok(false);
            }
            let want = (window as u64).min(chunk.size - offset) as usize;
            let mut bytes = None;
            if use_map {
                match Mapping::new(fd, offset, want) {
                    Ok(map) => bytes = Some(Bytes::Mapped(map)),
                    // Not mappable (some filesystems, special files): read() it.
                    Err(_) => use_map = false,
                }
            }
            let bytes = match bytes {
                Some(b) => b,
                None => {
                    // A chunk that cannot be mapped is read through a small
                    // pool of its own (the mmap path has no buffers).
                    let pool = match pool {
                        Some(p) => p,
                        None => own_pool.get_or_insert_with(|| Pool::new(2, window)),
                    };
                    let mut buf = pool.take();
                    let got = read_full(&mut file, offset, &mut buf.as_mut_slice()[..want])
                        .map_err(|e| io_err("read", e))?;
                    if got < want {
                        // The file shrank after we looked at its size.
                        return Err(size_err(offset + got as u64));
                    }
                    Bytes::Buffer(pool.share(buf, got))
                }
            };
            let started = Instant::now();
            self.out.write(bytes.data())?;
            let wrote = Instant::now();
            if let Some(h) = hasher.as_deref_mut() {
                h.update(bytes.data());
                let hashed = wrote.elapsed();
                self.planner.hashed(want as u64, hashed);
                if let Some(stats) = self.stats {
                    MergeStats::add(&stats.feeder_hash_ns, hashed);
                }
            }
            if let Some(stats) = self.stats {
                MergeStats::add(&stats.feeder_write_ns, wrote - started);
            }
            offset += want as u64;
            self.planner.split().sent();
            if !self.send(Msg::Data(bytes, hasher.is_some())) {
                return Ok(false);
            }
        }
        // The file grew (or shrank) after we looked at its size.
        let now = file.metadata().map_err(|e| io_err("stat", e))?.len();
        if now != chunk.size {
            return Err(size_err(now));
        }
        Ok(true)
    }
}

/// The window (mapping or buffer) size: `block_size` rounded up to a page.
fn window_size(options: &MergeOptions) -> usize {
    options.block_size.max(PAGE).div_ceil(PAGE) * PAGE
}

/// `pread` until `buf` is full or end of file.
fn read_full(file: &mut File, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
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

/// The chunk's and the whole file's checksum over the same bytes.
pub(crate) enum PairHasher {
    /// Both sha256 streams on one core, interleaved (see `sha256x2`).
    Sha256 {
        chunk: Sha256Stream,
        file: Sha256Stream,
    },
    Other {
        chunk: Hasher,
        file: Hasher,
    },
}

impl PairHasher {
    pub(crate) fn new(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::Sha256 => PairHasher::Sha256 { chunk: Sha256Stream::new(), file: Sha256Stream::new() },
            other => PairHasher::Other { chunk: Hasher::new(other), file: Hasher::new(other) },
        }
    }

    pub(crate) fn update(&mut self, data: &[u8]) {
        match self {
            PairHasher::Sha256 { chunk, file } => sha256x2::update_both(chunk, file, data),
            PairHasher::Other { chunk, file } => {
                chunk.update(data);
                file.update(data);
            }
        }
    }

    /// The whole file's checksum only (the chunk's is computed elsewhere).
    pub(crate) fn update_file(&mut self, data: &[u8]) {
        match self {
            PairHasher::Sha256 { file, .. } => file.update(data),
            PairHasher::Other { file, .. } => file.update(data),
        }
    }

    /// The finished chunk's hex; starts the next chunk.
    pub(crate) fn finish_chunk(&mut self) -> String {
        match self {
            PairHasher::Sha256 { chunk, .. } => std::mem::take(chunk).hex(),
            PairHasher::Other { chunk, .. } => {
                let algorithm = chunk.algorithm();
                std::mem::replace(chunk, Hasher::new(algorithm)).finalize_hex()
            }
        }
    }

    pub(crate) fn finish_file(self) -> String {
        match self {
            PairHasher::Sha256 { file, .. } => file.hex(),
            PairHasher::Other { file, .. } => file.finalize_hex(),
        }
    }
}

/// Bytes on their way from the feeder to the hasher.
enum Bytes {
    Mapped(Mapping),
    Buffer(Arc<Block>),
}

impl Bytes {
    fn data(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m.data(),
            Bytes::Buffer(b) => b.data(),
        }
    }
}

/// A read-only shared mapping of part of a chunk file, unmapped on drop (so
/// its pages stop counting toward RSS). Only sound while nobody truncates
/// the file: Serentak chunk files are immutable once written (temp + rename).
struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value alone.
unsafe impl Send for Mapping {}

impl Mapping {
    fn new(fd: libc::c_int, offset: u64, len: usize) -> std::io::Result<Self> {
        // SAFETY: a fresh read-only mapping; offset is page-aligned (windows
        // are whole pages) and len > 0.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { ptr, len })
    }

    fn data(&self) -> &[u8] {
        // SAFETY: ptr maps len readable bytes until drop.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping what `new` mapped.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}
