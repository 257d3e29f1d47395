//! Who computes each chunk's checksum, and the merge's timing counters.
//!
//! The whole-file checksum is one sequential stream, always on the calling
//! thread. A chunk's checksum is a second stream over the same bytes: the
//! calling thread can fuse it with the whole-file stream (`sha256x2`, ~1.2x
//! one stream's cost), or the feeder can hash it after writing (a whole
//! stream's cost, on the other core). Handing chunks to the feeder only pays
//! when the feeder has CPU time to spare: when it waits for the calling
//! thread (the window queue is full) and that wait is not just both threads
//! waiting for a CPU someone else holds. `ChunkHashing::Adaptive` measures
//! exactly that and hands a chunk over only against idle time already seen.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Which thread computes the per-chunk checksums (the whole-file checksum is
/// always the calling thread's: it is one sequential stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkHashing {
    /// The calling thread, fused with the whole-file stream (`sha256x2`).
    Caller,
    /// The feeder, after writing each window, so the calling thread runs the
    /// whole-file stream alone.
    Feeder,
    /// Per chunk: the feeder takes a chunk's checksum when the calling thread
    /// is behind (half the window queue or more is waiting), else the calling
    /// thread fuses it. Hands over even when the feeder has no time to spare
    /// (README "Measured": 4 GiB page cache, where `write()` is the
    /// bottleneck, and on a loaded machine it is slower than `Caller`).
    Balanced,
    /// Per chunk: the feeder takes a chunk's checksum only against idle time
    /// it has measured (blocked on a full queue) minus the time both threads
    /// spent waiting for a CPU (`/proc/thread-self/schedstat` run delay; the
    /// machine is busy, so the wait was not spare capacity), once that credit
    /// covers the chunk's hashing time at the feeder's measured rate. Never
    /// hands over when the feeder is the bottleneck or the CPUs are taken.
    Adaptive,
    /// `Adaptive` with two or more cores, else `Caller`.
    Auto,
}

impl ChunkHashing {
    /// What `Auto` means on this machine.
    pub fn resolve(self) -> ChunkHashing {
        match self {
            ChunkHashing::Auto => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                if cores >= 2 {
                    ChunkHashing::Adaptive
                } else {
                    ChunkHashing::Caller
                }
            }
            other => other,
        }
    }
}

/// Where a merge's time went (nanoseconds, both threads), for benchmarks and
/// profiling: pass one in `MergeOptions::stats`. Reading the counters costs
/// nothing measurable (a clock read per window and per blocked hand-over).
#[derive(Debug, Default)]
pub struct MergeStats {
    /// Feeder: in `write()` (copying into the output's page cache).
    pub feeder_write_ns: AtomicU64,
    /// Feeder: hashing chunks it took.
    pub feeder_hash_ns: AtomicU64,
    /// Feeder: blocked on a full window queue (the calling thread is behind).
    pub feeder_idle_ns: AtomicU64,
    /// Calling thread: hashing.
    pub caller_hash_ns: AtomicU64,
    /// Calling thread: waiting for the feeder (empty queue).
    pub caller_idle_ns: AtomicU64,
    /// Run-queue delay (runnable, no CPU) of both threads, where known.
    pub run_delay_ns: AtomicU64,
    /// Chunks whose checksum the feeder computed.
    pub chunks_by_feeder: AtomicU64,
    /// All chunks.
    pub chunks: AtomicU64,
}

impl MergeStats {
    pub(crate) fn add(counter: &AtomicU64, elapsed: Duration) {
        counter.fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
    }
}

/// A thread's run-queue delay so far (`/proc/thread-self/schedstat`, second
/// field: nanoseconds spent runnable but not running). `None` where the
/// kernel does not provide it; the file is opened once per thread.
pub(crate) struct RunDelay(Option<File>);

impl RunDelay {
    /// Opens the calling thread's counter.
    pub(crate) fn this_thread() -> Self {
        RunDelay(File::open("/proc/thread-self/schedstat").ok())
    }

    pub(crate) fn read(&self) -> Option<u64> {
        let file = self.0.as_ref()?;
        let mut buf = [0u8; 96];
        let n = file.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        text.split_ascii_whitespace().nth(1)?.parse().ok()
    }
}

/// What both threads share about the hand-over.
pub(crate) struct Split {
    mode: ChunkHashing,
    /// Windows sent and not yet taken by the calling thread.
    queued: AtomicUsize,
    /// `Balanced`: at or above this many queued windows the caller is behind.
    behind: usize,
    /// The calling thread's run-queue delay (readable from the feeder).
    caller_delay: RunDelay,
}

impl Split {
    /// Called on the merge's calling thread (it opens that thread's counter).
    pub(crate) fn new(mode: ChunkHashing, capacity: usize) -> Self {
        let mode = mode.resolve();
        let caller_delay =
            if mode == ChunkHashing::Adaptive { RunDelay::this_thread() } else { RunDelay(None) };
        Split { mode, queued: AtomicUsize::new(0), behind: capacity.div_ceil(2).max(1), caller_delay }
    }

    pub(crate) fn sent(&self) {
        self.queued.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn received(&self) {
        self.queued.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The feeder's side of the hand-over: decides, at each chunk's start,
/// whether the feeder computes its checksum.
pub(crate) struct Planner<'a> {
    split: &'a Split,
    own_delay: RunDelay,
    /// `Adaptive`: spare feeder time seen and not yet spent (ns; may go
    /// negative while the CPUs are contended, bounded both ways).
    credit: i64,
    /// Idle time since the last decision (ns).
    idle: u64,
    /// Both threads' run delay at the last decision.
    last_delay: Option<u64>,
    /// The feeder's hashing cost, ns per MiB (0: not measured yet).
    ns_per_mib: u64,
}

/// Until the feeder has hashed a chunk: assume ~0.6 GB/s, well below a
/// single SHA-NI stream (~2 GB/s), so the first hand-over needs ample idle
/// time; the first measurement replaces it.
const FIRST_GUESS_NS_PER_MIB: u64 = 1_700_000;

impl<'a> Planner<'a> {
    /// Called on the feeder thread.
    pub(crate) fn new(split: &'a Split) -> Self {
        let own_delay =
            if split.mode == ChunkHashing::Adaptive { RunDelay::this_thread() } else { RunDelay(None) };
        Planner { split, own_delay, credit: 0, idle: 0, last_delay: None, ns_per_mib: 0 }
    }

    pub(crate) fn split(&self) -> &Split {
        self.split
    }

    /// The feeder waited `elapsed` for room in the queue.
    pub(crate) fn idled(&mut self, elapsed: Duration) {
        self.idle += elapsed.as_nanos() as u64;
    }

    /// Whether the feeder computes the checksum of the next chunk (`size`
    /// bytes).
    pub(crate) fn feeder_takes(&mut self, size: u64, stats: Option<&MergeStats>) -> bool {
        match self.split.mode {
            ChunkHashing::Caller | ChunkHashing::Auto => false,
            ChunkHashing::Feeder => true,
            ChunkHashing::Balanced => self.split.queued.load(Ordering::Relaxed) >= self.split.behind,
            ChunkHashing::Adaptive => self.adaptive(size, stats),
        }
    }

    fn adaptive(&mut self, size: u64, stats: Option<&MergeStats>) -> bool {
        let delay = match (self.own_delay.read(), self.split.caller_delay.read()) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        let contended = match (delay, self.last_delay) {
            (Some(now), Some(before)) => now.saturating_sub(before),
            _ => 0,
        };
        if let (Some(stats), true) = (stats, contended > 0) {
            stats.run_delay_ns.fetch_add(contended, Ordering::Relaxed);
        }
        self.last_delay = delay;
        let cost = self.cost(size);
        let cap = (2 * cost).max(1) as i64;
        self.credit = (self.credit + self.idle as i64 - contended as i64).clamp(-cap, cap);
        self.idle = 0;
        if size > 0 && self.credit >= cost as i64 {
            self.credit -= cost as i64;
            true
        } else {
            false
        }
    }

    /// The expected time (ns) for the feeder to hash `size` bytes.
    fn cost(&self, size: u64) -> u64 {
        let per_mib = if self.ns_per_mib == 0 { FIRST_GUESS_NS_PER_MIB } else { self.ns_per_mib };
        (size as u128 * per_mib as u128 / (1 << 20) as u128) as u64
    }

    /// The feeder hashed `size` bytes in `elapsed`: update its rate (a
    /// moving average, so one preempted chunk does not dominate).
    pub(crate) fn hashed(&mut self, size: u64, elapsed: Duration) {
        if size < (64 << 10) {
            return; // too short to time
        }
        let sample = (elapsed.as_nanos() * (1 << 20) / size as u128) as u64;
        self.ns_per_mib = if self.ns_per_mib == 0 { sample } else { (3 * self.ns_per_mib + sample) / 4 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adaptive_takes_a_chunk_only_against_measured_idle_time() {
        let split = Split::new(ChunkHashing::Adaptive, 6);
        let mut planner = Planner::new(&split);
        planner.own_delay = RunDelay(None); // no contention in this test
        let mib = 1u64 << 20;
        assert!(!planner.feeder_takes(4 * mib, None), "no idle time seen yet");
        planner.hashed(4 * mib, Duration::from_millis(2)); // 0.5 ms per MiB
        planner.idled(Duration::from_millis(1));
        assert!(!planner.feeder_takes(4 * mib, None), "1 ms idle < 2 ms of hashing");
        planner.idled(Duration::from_millis(1));
        assert!(planner.feeder_takes(4 * mib, None), "2 ms idle in all covers it");
        assert!(!planner.feeder_takes(4 * mib, None), "the credit was spent");
        planner.idled(Duration::from_secs(10));
        assert!(planner.feeder_takes(4 * mib, None));
        assert!(planner.feeder_takes(4 * mib, None));
        assert!(!planner.feeder_takes(4 * mib, None), "credit is capped at two chunks");
    }

    #[test]
    fn run_delay_reads_where_the_kernel_has_it() {
        let delay = RunDelay::this_thread();
        if std::path::Path::new("/proc/thread-self/schedstat").exists() {
            assert!(delay.read().is_some());
        }
    }
}
