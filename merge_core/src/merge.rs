//! The ordered, verified merge (invariant 4).
//!
//! A pipeline over a fixed pool of aligned buffers:
//!
//! ```text
//!   reader (calling thread): read block, chunk checksum, size checks
//!        │ the same filled block (Arc), bounded by the pool
//!        ├──> file hasher thread: whole-file checksum
//!        └──> writer thread:      write to the temporary file, writeback
//! ```
//!
//! The per-chunk and whole-file checksums are two separate sha256 streams
//! over the same bytes, so they run on different threads (one per core), and
//! reading, hashing and writing overlap. The writer is mostly kernel copies
//! and waits; keeping it apart from the whole-file hash means a write blocked
//! by dirty-page throttling or writeback does not stall hashing until the
//! pool runs dry. The block is hashed by the reader right after `read()`,
//! while hot in its core's cache. The output is a temporary file beside
//! `output_path`, renamed into place only after every check passed.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::checksum::{Algorithm, Hasher};
use crate::chunk::{order_chunks, Chunk};
use crate::errors::MergeError;
use crate::output::TempOutput;
use crate::pool::{Block, Pool};

/// How a merge runs. `Default` is what the Python API uses.
#[derive(Clone, Debug)]
pub struct MergeOptions {
    pub algorithm: Algorithm,
    /// Checksum the merged file must have (hex), if the caller knows it.
    pub expected_checksum: Option<String>,
    /// fsync the file and its directory (and start writeback while merging).
    pub fsync: bool,
    /// Size of each pipeline buffer.
    pub block_size: usize,
    /// Number of pipeline buffers: memory is bounded by `blocks * block_size`.
    pub blocks: usize,
    /// Largest single `write()`; ~128 KiB writes beat 4 MiB ones ~5x here.
    pub write_size: usize,
    /// With `fsync`, ask for writeback after this many bytes, so the disk
    /// works while we hash rather than all at the final fsync.
    pub writeback_every: u64,
    /// Least time between two progress reports.
    pub progress_interval: Duration,
    /// Reserve the output's size up front (`fallocate`), so a full disk fails
    /// before any work. Off by default: on ext4 it made page-cache merges ~4x
    /// slower (writes into unwritten extents).
    pub preallocate: bool,
}

impl Default for MergeOptions {
    fn default() -> Self {
        MergeOptions {
            algorithm: Algorithm::Sha256,
            expected_checksum: None,
            fsync: true,
            block_size: 256 << 10,
            blocks: 32,
            write_size: 128 << 10,
            writeback_every: 4 << 20,
            progress_interval: Duration::from_millis(250),
            preallocate: false,
        }
    }
}

impl MergeOptions {
    /// The most memory the pipeline's buffers take.
    pub fn buffer_budget(&self) -> usize {
        self.blocks * self.block_size
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
    Data(Arc<Block>),
    /// All bytes of the chunk at this position (in index order) were sent.
    ChunkEnd(usize),
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
    let pool = Pool::new(blocks, options.block_size);
    let (to_writer, writer_rx) = sync_channel::<Msg>(blocks + 1);
    let (to_file_hasher, file_hasher_rx) = sync_channel::<Arc<Block>>(blocks + 1);

    let file_checksum = std::thread::scope(|scope| {
        let writer = {
            let (output, failure) = (&output, &failure);
            scope.spawn(move || write_output(writer_rx, output, options, failure))
        };
        let file_hasher = scope.spawn(move || hash_file(file_hasher_rx, algorithm));
        let downstream = Downstream { writer: to_writer, file_hasher: to_file_hasher };
        read_chunks(&chunks, &pool, downstream, total, options, &failure, progress);
        writer.join().expect("writer thread panicked");
        file_hasher.join().expect("file hasher thread panicked")
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

/// The reader: streams every chunk, in order, to the writer, checking each
/// chunk's size and checksum as it goes. Stops at the first failure anywhere.
/// Dropping `to_writer` on return tells the writer to finish.
fn read_chunks(
    chunks: &[Chunk],
    pool: &Pool,
    downstream: Downstream,
    total: u64,
    options: &MergeOptions,
    failure: &Failure,
    progress: &mut dyn FnMut(u64, u64) -> bool,
) {
    let mut done = 0u64;
    let mut last_report = Instant::now();
    let mut hasher = Hasher::new(options.algorithm);
    if !progress(0, total) {
        failure.record(usize::MAX, MergeError::Interrupted);
        return;
    }
    for (position, chunk) in chunks.iter().enumerate() {
        let result = read_chunk(chunk, pool, &downstream, &mut hasher, failure, |n| {
            done += n;
            if last_report.elapsed() >= options.progress_interval {
                last_report = Instant::now();
                return progress(done, total);
            }
            true
        });
        let actual = std::mem::replace(&mut hasher, Hasher::new(options.algorithm)).finalize_hex();
        match result {
            Ok(true) if actual == chunk.checksum => {}
            Ok(true) => {
                let err = MergeError::ChunkChecksumMismatch {
                    index: chunk.index,
                    path: chunk.path.clone(),
                    expected: chunk.checksum.clone(),
                    actual,
                };
                return failure.record(position, err);
            }
            Ok(false) => {
                if !failure.aborted() {
                    failure.record(usize::MAX, MergeError::Interrupted);
                }
                return;
            }
            Err(err) => return failure.record(position, err),
        }
        if downstream.writer.send(Msg::ChunkEnd(position)).is_err() {
            return; // the writer failed and said why
        }
    }
}

/// Sends one chunk's bytes, hashing them into `hasher`; `Ok(false)` means
/// stop (the writer failed, or progress asked to stop).
fn read_chunk(
    chunk: &Chunk,
    pool: &Pool,
    downstream: &Downstream,
    hasher: &mut Hasher,
    failure: &Failure,
    mut on_bytes: impl FnMut(u64) -> bool,
) -> Result<bool, MergeError> {
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
    // SAFETY: advisory syscall on an fd we own.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL) };
    let mut remaining = chunk.size;
    while remaining > 0 {
        if failure.aborted() {
            return Ok(false);
        }
        let mut buf = pool.take();
        let want = (buf.len() as u64).min(remaining) as usize;
        let got = read_full(&mut file, &mut buf.as_mut_slice()[..want]).map_err(|e| io_err("read", e))?;
        if got < want {
            // The file shrank after we looked at its size.
            return Err(size_err(chunk.size - remaining + got as u64));
        }
        remaining -= got as u64;
        hasher.update(&buf.as_slice()[..got]);
        if !downstream.send(pool.share(buf, got)) || !on_bytes(got as u64) {
            return Ok(false);
        }
    }
    // The file grew after we looked at its size.
    let mut probe = [0u8; 1];
    if read_full(&mut file, &mut probe).map_err(|e| io_err("read", e))? > 0 {
        let now = file.metadata().map(|m| m.len()).unwrap_or(chunk.size + 1);
        return Err(size_err(now.max(chunk.size + 1)));
    }
    Ok(true)
}

fn read_full(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// The writer: the bytes to the temporary file, in pieces of at most
/// `write_size`; with `fsync`, starts writeback every `writeback_every` bytes.
/// After a failure it keeps draining so the reader never waits on it.
fn write_output(rx: Receiver<Msg>, output: &TempOutput, options: &MergeOptions, failure: &Failure) {
    let mut file = output.file();
    let fd = file.as_raw_fd();
    let (mut written, mut flushed) = (0u64, 0u64);
    let mut position = 0usize;
    for msg in rx {
        match msg {
            Msg::Data(block) if !failure.aborted() => {
                for piece in block.data().chunks(options.write_size.max(1)) {
                    if let Err(e) = file.write_all(piece) {
                        failure.record(position, MergeError::io(None, output.temp_path(), "write", e));
                        break;
                    }
                    written += piece.len() as u64;
                }
                if options.fsync && written - flushed >= options.writeback_every {
                    start_writeback(fd, flushed, written - flushed);
                    flushed = written;
                }
            }
            Msg::Data(_) => {}
            Msg::ChunkEnd(p) => position = p + 1,
        }
    }
    if options.fsync && written > flushed {
        start_writeback(fd, flushed, written - flushed);
    }
}

/// The whole-file checksum, on its own thread so that neither a blocked
/// write (dirty-page throttling, writeback) nor the chunk hashing holds it up.
fn hash_file(rx: Receiver<Arc<Block>>, algorithm: Algorithm) -> String {
    let mut hasher = Hasher::new(algorithm);
    for block in rx {
        hasher.update(block.data());
    }
    hasher.finalize_hex()
}

/// Where the reader sends each block: the writer and the whole-file hasher.
struct Downstream {
    writer: SyncSender<Msg>,
    file_hasher: SyncSender<Arc<Block>>,
}

impl Downstream {
    /// False when the writer has stopped (after a failure it recorded).
    fn send(&self, block: Arc<Block>) -> bool {
        self.file_hasher.send(Arc::clone(&block)).is_ok() && self.writer.send(Msg::Data(block)).is_ok()
    }
}

fn start_writeback(fd: libc::c_int, offset: u64, len: u64) {
    // Only a hint: the final fsync is what makes the data durable.
    // SAFETY: plain syscall on an open fd.
    unsafe {
        libc::sync_file_range(fd, offset as libc::off64_t, len as libc::off64_t, libc::SYNC_FILE_RANGE_WRITE);
    }
}
