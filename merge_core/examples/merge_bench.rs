//! Compares merge configurations on the same inputs, interleaved, median of
//! N runs (page cache, fsync off unless FSYNC=1; sha256 unless ALG=blake3|crc32c;
//! `ONLY=a,b` keeps the configurations whose names contain `a` or `b`;
//! `DROP=never|always` sets the base's drop-behind without fsync):
//! `cargo run --release --example merge_bench -- DIR_OF_CHUNK_FILES COUNT RUNS`
//! Each configuration's second line is where its time went (`MergeStats`,
//! seconds per GB summed over both threads' activities, median run).
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use _merge_core::checksum::{checksum_file, Algorithm};
use _merge_core::chunk::Chunk;
use _merge_core::merge::{merge, ChunkHashing, MergeOptions, MergeStats};

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
    let mut base = MergeOptions { fsync, algorithm, ..Default::default() };
    match std::env::var("DROP").as_deref() {
        Ok("never") => base.drop_behind_from = u64::MAX,
        Ok("always") => base.drop_behind_from = 0,
        _ => {}
    }
    let mut configs: Vec<(&str, MergeOptions)> = vec![
        ("mmap write 1Mx8", base.clone()),
        ("read 1Mx8", MergeOptions { mmap: false, ..base.clone() }),
        ("read 256Kx32", MergeOptions { mmap: false, block_size: 256 << 10, blocks: 32, ..base.clone() }),
        ("mmap write 4Mx4", MergeOptions { block_size: 4 << 20, blocks: 4, ..base.clone() }),
        ("mmap write 256Kx32", MergeOptions { block_size: 256 << 10, blocks: 32, ..base.clone() }),
        ("mmap write 1M pieces", MergeOptions { write_size: 1 << 20, ..base.clone() }),
        ("mmap no drop-behind", MergeOptions { drop_behind: 0, ..base.clone() }),
        ("mmap drop-behind wait", MergeOptions { drop_behind_from: 0, drop_waits: true, ..base.clone() }),
        ("mmap drop-behind nowait", MergeOptions { drop_behind_from: 0, drop_waits: false, ..base.clone() }),
        ("mmap drop-behind never", MergeOptions { drop_behind_from: u64::MAX, ..base.clone() }),
        ("chunks fused on caller", MergeOptions { chunk_hashing: ChunkHashing::Caller, ..base.clone() }),
        ("chunks on feeder", MergeOptions { chunk_hashing: ChunkHashing::Feeder, ..base.clone() }),
        ("chunks balanced", MergeOptions { chunk_hashing: ChunkHashing::Balanced, ..base.clone() }),
        ("chunks adaptive", MergeOptions { chunk_hashing: ChunkHashing::Adaptive, ..base.clone() }),
    ];
    if let Ok(only) = std::env::var("ONLY") {
        configs.retain(|(n, _)| only.split(',').any(|o| n.contains(o)));
    }
    let out = dir.join("bench-out.bin");
    if std::env::var("CAT").is_ok_and(|v| v == "1") {
        configs.insert(0, ("cat (baseline)", base.clone()));
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let mut stats: Vec<Vec<(f64, String)>> = vec![Vec::new(); configs.len()];
    for _ in 0..runs {
        for (i, (name, options)) in configs.iter().enumerate() {
            for c in &chunks {
                std::fs::read(&c.path).unwrap();
            }
            // SAFETY: plain syscall.
            unsafe { libc::sync() };
            let counters = Arc::new(MergeStats::default());
            let options = MergeOptions { stats: Some(counters.clone()), ..options.clone() };
            let (t, c) = (Instant::now(), cpu_seconds());
            if *name == "cat (baseline)" {
                let status = std::process::Command::new("cat")
                    .args(chunks.iter().map(|c| &c.path))
                    .stdout(std::fs::File::create(&out).unwrap())
                    .status()
                    .unwrap();
                assert!(status.success());
            } else {
                merge(chunks.clone(), &out, &options, &mut |_, _| true).unwrap();
            }
            let elapsed = t.elapsed().as_secs_f64();
            times[i].push(elapsed);
            cpu[i].push(cpu_seconds() - c);
            stats[i].push((elapsed, describe(&counters, total)));
            std::fs::remove_file(&out).unwrap();
        }
    }
    for ((((name, _), mut t), mut c), mut s) in configs.iter().zip(times).zip(cpu).zip(stats) {
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
        s.sort_by(|a, b| a.0.total_cmp(&b.0));
        println!("{:24} {}", "", s[s.len() / 2].1);
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

/// One run's `MergeStats` as seconds per GB.
fn describe(s: &MergeStats, total: u64) -> String {
    let per_gb =
        |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed) as f64 / 1e9 / (total as f64 / 1e9);
    format!(
        "feeder write {:.2} hash {:.2} idle {:.2} | caller hash {:.2} idle {:.2} | run delay {:.2} s/GB | feeder hashed {}/{} chunks",
        per_gb(&s.feeder_write_ns),
        per_gb(&s.feeder_hash_ns),
        per_gb(&s.feeder_idle_ns),
        per_gb(&s.caller_hash_ns),
        per_gb(&s.caller_idle_ns),
        per_gb(&s.run_delay_ns),
        s.chunks_by_feeder.load(Ordering::Relaxed),
        s.chunks.load(Ordering::Relaxed),
    )
}
