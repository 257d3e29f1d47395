//! The merge's feeder thread: opens each chunk in order, checks its size,
//! maps (or reads) it a window at a time and writes it to the output before
//! handing it to the hasher (`merge.rs`).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::Instant;

use crate::checksum::Hasher;
use crate::chunk::Chunk;
use crate::errors::MergeError;
use crate::failure::Failure;
use crate::handover::{MergeStats, Planner};
use crate::messages::Msg;
use crate::options::MergeOptions;
use crate::pool::Pool;
use crate::window::{window_size, Bytes, Mapping};
use crate::writer::Writer;

/// The feeder (a spawned thread): opens each chunk in order, checks its size,
/// maps (or reads) it a window at a time, writes each window to the temporary
/// file and then hands it to the hasher. Chunk errors and write errors travel
/// in order with the data (`Msg::Fail`), so the hasher reports the lowest
/// failing chunk even though the feeder runs ahead of it.
pub(crate) struct Feeder<'a> {
    pub(crate) tx: SyncSender<Msg>,
    pub(crate) pool: Option<&'a Pool>,
    pub(crate) out: Writer<'a>,
    pub(crate) options: &'a MergeOptions,
    pub(crate) failure: &'a Failure,
    pub(crate) planner: Planner<'a>,
    pub(crate) stats: Option<&'a MergeStats>,
}

impl Feeder<'_> {
    pub(crate) fn run(mut self, chunks: &[Chunk]) {
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
