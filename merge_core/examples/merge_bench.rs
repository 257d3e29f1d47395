//! Compares merge configurations on the same inputs, interleaved, median of
//! N runs (page cache, fsync off unless FSYNC=1; sha256 unless ALG=blake3|crc32c):
//! `cargo run --release --example merge_bench -- DIR_OF_CHUNK_FILES COUNT RUNS`
use std::path::PathBuf;
use std::time::Instant;

use _merge_core::checksum::{checksum_file, Algorithm};
use _merge_core::chunk::Chunk;
use _merge_core::merge::{merge, ChunkHashing, MergeOptions};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(&args[1]);
    let count: usize = args[2].parse().unwrap();
    let runs: usize = args[3].parse().unwrap();
    let fsync = std::env::var("FSYNC").is_ok_and(|v| v == "1");
    let algorithm = Algorithm::parse(&std::env::var("ALG").unwrap_or_else(|_| "sha256".into())).unwrap();
    let chunks: Vec<Chunk> = (0..count)
        .map(|i| {
            let path = dir.join(format!("chunk-{i:05}"));
            let (checksum, size) = checksum_file(&path, algorithm).unwrap();
            Chunk { index: i as u64, path, size, checksum }
        })
        .collect();
    let total: u64 = chunks.iter().map(|c| c.size).sum();
    let base = MergeOptions { fsync, algorithm, ..Default::default() };
    let mut configs: Vec<(&str, MergeOptions)> = vec![
        ("mmap write 1Mx8", base.clone()),
        ("read 1Mx8", MergeOptions { mmap: false, ..base.clone() }),
        ("read 256Kx32", MergeOptions { mmap: false, block_size: 256 << 10, blocks: 32, ..base.clone() }),
        ("mmap write 4Mx4", MergeOptions { block_size: 4 << 20, blocks: 4, ..base.clone() }),
        ("mmap write 256Kx32", MergeOptions { block_size: 256 << 10, blocks: 32, ..base.clone() }),
        ("mmap write 1M pieces", MergeOptions { write_size: 1 << 20, ..base.clone() }),
        ("mmap no drop-behind", MergeOptions { drop_behind: 0, ..base.clone() }),
        ("mmap drop-behind always", MergeOptions { drop_behind_always: true, ..base.clone() }),
        ("chunks fused on caller", MergeOptions { chunk_hashing: ChunkHashing::Caller, ..base.clone() }),
        ("chunks on feeder", MergeOptions { chunk_hashing: ChunkHashing::Feeder, ..base.clone() }),
        ("chunks balanced", MergeOptions { chunk_hashing: ChunkHashing::Balanced, ..base.clone() }),
    ];
    if let Ok(only) = std::env::var("ONLY") {
        configs.retain(|(n, _)| only.split(',').any(|o| n.contains(o)));
    }
    let out = dir.join("bench-out.bin");
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for _ in 0..runs {
        for (i, (_, options)) in configs.iter().enumerate() {
            for c in &chunks {
                std::fs::read(&c.path).unwrap();
            }
            // SAFETY: plain syscall.
            unsafe { libc::sync() };
            let (t, c) = (Instant::now(), cpu_seconds());
            merge(chunks.clone(), &out, options, &mut |_, _| true).unwrap();
            times[i].push(t.elapsed().as_secs_f64());
            cpu[i].push(cpu_seconds() - c);
            std::fs::remove_file(&out).unwrap();
        }
    }
    for (((name, _), mut t), mut c) in configs.iter().zip(times).zip(cpu) {
        t.sort_by(f64::total_cmp);
        c.sort_by(f64::total_cmp);
        let med = t[t.len() / 2];
        let gb = total as f64 / 1e9;
        println!(
            "{name:24} median {:6.0} MB/s, cpu {:.2} s/GB  (runs: {})",
            total as f64 / med / 1e6,
            c[c.len() / 2] / gb,
            t.iter().map(|s| format!("{:.0}", total as f64 / s / 1e6)).collect::<Vec<_>>().join(" ")
        );
    }
}

/// User + system CPU time of this process so far.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into a local.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}
