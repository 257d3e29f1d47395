//! End-to-end tests of the Rust merge: ordering, verification, cleanup.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use _merge_core::checksum::{Algorithm, Hasher};
use _merge_core::chunk::Chunk;
use _merge_core::errors::MergeError;
use _merge_core::merge::{merge, ChunkHashing, MergeOptions};

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "merge_core_test_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn entries(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn hex(alg: Algorithm, data: &[u8]) -> String {
    let mut h = Hasher::new(alg);
    h.update(data);
    h.finalize_hex()
}

fn data(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
}

/// Writes chunk files `c{i}` in `dir/chunks` and returns them with their data.
fn make_chunks(dir: &Path, sizes: &[usize], alg: Algorithm) -> (Vec<Chunk>, Vec<u8>) {
    let chunk_dir = dir.join("chunks");
    fs::create_dir_all(&chunk_dir).unwrap();
    let mut all = Vec::new();
    let mut chunks = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        let bytes = data(i, len);
        // Names sort the wrong way on purpose: order must come from `index`.
        let path = chunk_dir.join(format!("c{}", sizes.len() - i));
        fs::write(&path, &bytes).unwrap();
        chunks.push(Chunk { index: i as u64, path, size: len as u64, checksum: hex(alg, &bytes) });
        all.extend_from_slice(&bytes);
    }
    (chunks, all)
}

fn small_options(alg: Algorithm) -> MergeOptions {
    // Tiny buffers so chunks span many blocks and writes.
    MergeOptions {
        algorithm: alg,
        block_size: 4096,
        blocks: 3,
        write_size: 1000,
        fsync: false,
        ..Default::default()
    }
}

fn run(
    chunks: Vec<Chunk>,
    out: &Path,
    options: &MergeOptions,
) -> Result<_merge_core::merge::MergeOutcome, MergeError> {
    merge(chunks, out, options, &mut |_, _| true)
}

#[test]
fn merges_in_index_order_for_every_algorithm() {
    for alg in Algorithm::ALL {
        let dir = TempDir::new();
        let (mut chunks, all) = make_chunks(&dir.0, &[10_000, 0, 1, 4096, 8193, 0], alg);
        chunks.reverse();
        let out = dir.0.join("out.bin");
        let outcome = run(chunks, &out, &small_options(alg)).unwrap();
        assert_eq!(fs::read(&out).unwrap(), all);
        assert_eq!(outcome.size, all.len() as u64);
        assert_eq!(outcome.checksum, hex(alg, &all));
        assert_eq!(outcome.chunk_count, 6);
        assert_eq!(dir.entries(), vec!["chunks", "out.bin"]);
    }
}

#[test]
fn durable_merge_with_default_options() {
    let dir = TempDir::new();
    let (chunks, all) = make_chunks(&dir.0, &[300_000, 1 << 20, 5], Algorithm::Sha256);
    let out = dir.0.join("out.bin");
    let expected = hex(Algorithm::Sha256, &all);
    let options = MergeOptions { expected_checksum: Some(expected.to_uppercase()), ..Default::default() };
    let mut reports = Vec::new();
    let outcome = merge(chunks, &out, &options, &mut |d, t| {
        reports.push((d, t));
        true
    })
    .unwrap();
    assert_eq!(outcome.checksum, expected);
    assert_eq!(fs::read(&out).unwrap(), all);
    assert_eq!(reports.first(), Some(&(0, all.len() as u64)));
    assert_eq!(reports.last(), Some(&(all.len() as u64, all.len() as u64)));
}

#[test]
fn empty_merge_makes_an_empty_file() {
    let dir = TempDir::new();
    let out = dir.0.join("out.bin");
    let outcome = run(vec![], &out, &small_options(Algorithm::Sha256)).unwrap();
    assert_eq!(outcome.size, 0);
    assert_eq!(fs::read(&out).unwrap(), Vec::<u8>::new());
}

#[test]
fn a_corrupt_byte_is_caught_with_its_index_and_leaves_nothing() {
    let dir = TempDir::new();
    let (chunks, _) = make_chunks(&dir.0, &[5000, 9000, 3000], Algorithm::Crc32c);
    let mut bytes = fs::read(&chunks[1].path).unwrap();
    bytes[8999] ^= 1;
    fs::write(&chunks[1].path, &bytes).unwrap();
    let out = dir.0.join("out.bin");
    match run(chunks, &out, &small_options(Algorithm::Crc32c)) {
        Err(MergeError::ChunkChecksumMismatch { index: 1, .. }) => {}
        other => panic!("expected mismatch at 1, got {other:?}"),
    }
    assert_eq!(dir.entries(), vec!["chunks"]);
}

#[test]
fn the_lowest_bad_chunk_is_reported() {
    let dir = TempDir::new();
    let (mut chunks, _) = make_chunks(&dir.0, &[5000, 5000, 5000, 5000], Algorithm::Sha256);
    chunks[3].size = 1; // size error, later
    chunks[1].checksum = hex(Algorithm::Sha256, b"other"); // checksum error, first
    let out = dir.0.join("out.bin");
    assert!(matches!(
        run(chunks, &out, &small_options(Algorithm::Sha256)),
        Err(MergeError::ChunkChecksumMismatch { index: 1, .. })
    ));
}

#[test]
fn size_mismatch_and_missing_file() {
    let dir = TempDir::new();
    let (mut chunks, _) = make_chunks(&dir.0, &[100, 200], Algorithm::Sha256);
    chunks[1].size = 199;
    let out = dir.0.join("out.bin");
    assert!(matches!(
        run(chunks.clone(), &out, &small_options(Algorithm::Sha256)),
        Err(MergeError::ChunkSizeMismatch { index: 1, expected: 199, actual: 200, .. })
    ));
    chunks[1].size = 200;
    fs::remove_file(&chunks[0].path).unwrap();
    assert!(matches!(
        run(chunks, &out, &small_options(Algorithm::Sha256)),
        Err(MergeError::Io { index: Some(0), .. })
    ));
    assert_eq!(dir.entries(), vec!["chunks"]);
}

#[test]
fn whole_file_mismatch_leaves_nothing() {
    let dir = TempDir::new();
    let (chunks, _) = make_chunks(&dir.0, &[100, 200], Algorithm::Blake3);
    let out = dir.0.join("out.bin");
    let options =
        MergeOptions { expected_checksum: Some("0".repeat(64)), ..small_options(Algorithm::Blake3) };
    assert!(matches!(run(chunks, &out, &options), Err(MergeError::FileChecksumMismatch { .. })));
    assert_eq!(dir.entries(), vec!["chunks"]);
}

#[test]
fn stopping_from_progress_leaves_nothing() {
    let dir = TempDir::new();
    let (chunks, _) = make_chunks(&dir.0, &[100_000, 100_000], Algorithm::Sha256);
    let out = dir.0.join("out.bin");
    let options =
        MergeOptions { progress_interval: std::time::Duration::ZERO, ..small_options(Algorithm::Sha256) };
    let mut calls = 0;
    let result = merge(chunks, &out, &options, &mut |_, _| {
        calls += 1;
        calls < 5
    });
    assert!(matches!(result, Err(MergeError::Interrupted)));
    assert_eq!(dir.entries(), vec!["chunks"]);
}

#[test]
fn missing_output_directory_is_an_io_error() {
    let dir = TempDir::new();
    let (chunks, _) = make_chunks(&dir.0, &[10], Algorithm::Sha256);
    let out = dir.0.join("no/such/dir/out.bin");
    assert!(matches!(
        run(chunks, &out, &small_options(Algorithm::Sha256)),
        Err(MergeError::Io { index: None, .. })
    ));
}

#[test]
fn replaces_an_existing_output_atomically() {
    let dir = TempDir::new();
    let (chunks, all) = make_chunks(&dir.0, &[10, 20], Algorithm::Sha256);
    let out = dir.0.join("out.bin");
    fs::write(&out, b"old").unwrap();
    let mut bad = chunks.clone();
    bad[0].size = 11;
    assert!(run(bad, &out, &small_options(Algorithm::Sha256)).is_err());
    assert_eq!(fs::read(&out).unwrap(), b"old");
    run(chunks, &out, &small_options(Algorithm::Sha256)).unwrap();
    assert_eq!(fs::read(&out).unwrap(), all);
}

#[test]
fn read_mode_and_mmap_mode_agree() {
    for alg in Algorithm::ALL {
        for mmap in [true, false] {
            let dir = TempDir::new();
            // Sizes spanning several windows, multiples of 64 and not.
            let (mut chunks, all) = make_chunks(&dir.0, &[4096 * 5, 0, 4096 * 3 + 7, 64, 1, 12_345], alg);
            chunks.reverse();
            let out = dir.0.join("out.bin");
            let options = MergeOptions { mmap, ..small_options(alg) };
            let outcome = run(chunks, &out, &options).unwrap();
            assert_eq!(fs::read(&out).unwrap(), all, "{alg:?} mmap={mmap}");
            assert_eq!(outcome.checksum, hex(alg, &all));
            assert_eq!(dir.entries(), vec!["chunks", "out.bin"]);
        }
    }
}

#[test]
fn lowest_bad_chunk_is_reported_in_both_modes() {
    for mmap in [true, false] {
        let dir = TempDir::new();
        let (mut chunks, _) = make_chunks(&dir.0, &[40_000, 40_000, 40_000, 40_000], Algorithm::Sha256);
        chunks[1].checksum = hex(Algorithm::Sha256, b"other"); // found by the hasher
        fs::remove_file(&chunks[3].path).unwrap(); // found earlier, by the feeder
        let out = dir.0.join("out.bin");
        let options = MergeOptions { mmap, ..small_options(Algorithm::Sha256) };
        assert!(
            matches!(run(chunks, &out, &options), Err(MergeError::ChunkChecksumMismatch { index: 1, .. })),
            "mmap={mmap}"
        );
        assert_eq!(dir.entries(), vec!["chunks"]);
    }
}

#[test]
fn a_chunk_longer_than_listed_is_a_size_mismatch() {
    for mmap in [true, false] {
        let dir = TempDir::new();
        let (mut chunks, _) = make_chunks(&dir.0, &[5000, 5000], Algorithm::Sha256);
        chunks[0].size = 4999;
        let out = dir.0.join("out.bin");
        let options = MergeOptions { mmap, ..small_options(Algorithm::Sha256) };
        assert!(matches!(
            run(chunks, &out, &options),
            Err(MergeError::ChunkSizeMismatch { index: 0, expected: 4999, actual: 5000, .. })
        ));
    }
}

const CHUNK_HASHING: [ChunkHashing; 5] = [
    ChunkHashing::Caller,
    ChunkHashing::Feeder,
    ChunkHashing::Balanced,
    ChunkHashing::Adaptive,
    ChunkHashing::Auto,
];

#[test]
fn every_chunk_hashing_mode_gives_the_same_file_and_checksums() {
    // Odd sizes: the whole-file stream is mid-block when a chunk starts, on
    // either thread. Balanced switches threads as the queue fills and drains.
    let sizes = [10_000, 0, 1, 4096, 8193, 65, 64, 40_000, 3, 12_288, 7, 100_000];
    for alg in Algorithm::ALL {
        for mode in CHUNK_HASHING {
            for mmap in [true, false] {
                let dir = TempDir::new();
                let (chunks, all) = make_chunks(&dir.0, &sizes, alg);
                let out = dir.0.join("out.bin");
                let options = MergeOptions { chunk_hashing: mode, mmap, ..small_options(alg) };
                let outcome = run(chunks, &out, &options).unwrap();
                assert_eq!(fs::read(&out).unwrap(), all, "{alg:?} {mode:?} mmap={mmap}");
                assert_eq!(outcome.checksum, hex(alg, &all), "{alg:?} {mode:?} mmap={mmap}");
            }
        }
    }
}

#[test]
fn the_lowest_bad_chunk_wins_whichever_thread_hashes_it() {
    for mode in CHUNK_HASHING {
        for _ in 0..5 {
            let dir = TempDir::new();
            let (mut chunks, _) = make_chunks(&dir.0, &[20_000; 10], Algorithm::Sha256);
            chunks[4].checksum = hex(Algorithm::Sha256, b"other");
            chunks[6].checksum = hex(Algorithm::Sha256, b"another");
            fs::remove_file(&chunks[8].path).unwrap(); // found first, by the feeder
            let out = dir.0.join("out.bin");
            let options = MergeOptions { chunk_hashing: mode, ..small_options(Algorithm::Sha256) };
            assert!(
                matches!(
                    run(chunks, &out, &options),
                    Err(MergeError::ChunkChecksumMismatch { index: 4, .. })
                ),
                "{mode:?}"
            );
            assert_eq!(dir.entries(), vec!["chunks"]);
        }
    }
}

/// Drop-behind tuned down so a small merge drops: writeback every 64 KiB,
/// dropping what lies more than 256 KiB behind the writer.
fn dropping(alg: Algorithm, fsync: bool, drop_behind_from: u64) -> MergeOptions {
    MergeOptions {
        algorithm: alg,
        fsync,
        block_size: 64 << 10,
        blocks: 4,
        write_size: 16 << 10,
        writeback_every: 64 << 10,
        drop_behind: 256 << 10,
        drop_behind_from,
        ..Default::default()
    }
}

/// How many of `path`'s pages are in the page cache (`mincore`).
fn cached_pages(path: &Path) -> usize {
    let file = fs::File::open(path).unwrap();
    let len = file.metadata().unwrap().len() as usize;
    let page = 4096;
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: a fresh read-only mapping of `len` bytes, unmapped below;
    // `vec` holds one byte per page.
    unsafe {
        use std::os::unix::io::AsRawFd;
        let ptr =
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0);
        assert_ne!(ptr, libc::MAP_FAILED);
        assert_eq!(libc::mincore(ptr, len, vec.as_mut_ptr()), 0);
        libc::munmap(ptr, len);
    }
    vec.iter().filter(|&&b| b & 1 == 1).count()
}

#[test]
fn drop_behind_on_or_off_gives_the_same_bytes_and_checksums() {
    let sizes = [1 << 20, 300_001, 1 << 20, 65, 700_000, 1 << 20];
    for alg in Algorithm::ALL {
        for fsync in [false, true] {
            for from in [0, u64::MAX] {
                let dir = TempDir::new();
                let (chunks, all) = make_chunks(&dir.0, &sizes, alg);
                let out = dir.0.join("out.bin");
                let outcome = run(chunks, &out, &dropping(alg, fsync, from)).unwrap();
                assert_eq!(fs::read(&out).unwrap(), all, "{alg:?} fsync={fsync} from={from}");
                assert_eq!(outcome.checksum, hex(alg, &all), "{alg:?} fsync={fsync} from={from}");
            }
        }
    }
}

#[test]
fn drop_behind_leaves_the_output_uncached_and_off_leaves_it_cached() {
    let dir = TempDir::new();
    let (chunks, all) = make_chunks(&dir.0, &[1 << 20; 4], Algorithm::Sha256);
    let pages = all.len() / 4096;
    let out = dir.0.join("kept.bin");
    run(chunks.clone(), &out, &dropping(Algorithm::Sha256, false, u64::MAX)).unwrap();
    assert_eq!(cached_pages(&out), pages, "never dropping keeps every page cached");

    // Without fsync only pages already written back are dropped; wait for
    // writeback so the test does not depend on the disk's speed.
    let out = dir.0.join("dropped.bin");
    let options = MergeOptions { drop_waits: true, ..dropping(Algorithm::Sha256, false, 0) };
    run(chunks.clone(), &out, &options).unwrap();
    let cached = cached_pages(&out);
    assert!(cached <= pages / 2, "{cached} of {pages} pages still cached");
    assert_eq!(fs::read(&out).unwrap(), all);

    // The size threshold: a merge smaller than `drop_behind_from` keeps
    // its output cached.
    let out = dir.0.join("small.bin");
    let options =
        MergeOptions { drop_waits: true, ..dropping(Algorithm::Sha256, false, all.len() as u64 + 1) };
    run(chunks, &out, &options).unwrap();
    assert_eq!(cached_pages(&out), pages);
}

#[test]
fn a_late_bad_chunk_fails_cleanly_after_output_was_dropped() {
    for fsync in [false, true] {
        for waits in [false, true] {
            let dir = TempDir::new();
            let (mut chunks, _) = make_chunks(&dir.0, &[1 << 20; 4], Algorithm::Sha256);
            // The last chunk: by then more than `drop_behind` was dropped.
            chunks[3].checksum = hex(Algorithm::Sha256, b"not this chunk");
            let out = dir.0.join("out.bin");
            let options = MergeOptions { drop_waits: waits, ..dropping(Algorithm::Sha256, fsync, 0) };
            assert!(
                matches!(
                    run(chunks, &out, &options),
                    Err(MergeError::ChunkChecksumMismatch { index: 3, .. })
                ),
                "fsync={fsync} waits={waits}"
            );
            assert_eq!(dir.entries(), vec!["chunks"], "no output, no temporary file");
        }
    }
}

#[test]
fn a_whole_file_mismatch_fails_cleanly_with_drop_behind() {
    let dir = TempDir::new();
    let (chunks, _) = make_chunks(&dir.0, &[1 << 20; 3], Algorithm::Blake3);
    let out = dir.0.join("out.bin");
    let options = MergeOptions {
        expected_checksum: Some(hex(Algorithm::Blake3, b"something else")),
        ..dropping(Algorithm::Blake3, false, 0)
    };
    assert!(matches!(run(chunks, &out, &options), Err(MergeError::FileChecksumMismatch { .. })));
    assert_eq!(dir.entries(), vec!["chunks"]);
}
