//! One received chunk to a new file, hashed in the same pass: the upload
//! service's per-chunk check and staging in one call (one worker-thread hop, one
//! walk over the bytes while they are in the CPU cache).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::checksum::{Algorithm, Hasher};
use crate::errors::MergeError;

/// Bytes hashed and then written per step: small enough to stay in L2 between
/// the hash and the copy into the page cache.
const STEP: usize = 256 << 10;

/// The file's mode: chunks are every tenant's data, readable by the service alone.
const FILE_MODE: u32 = 0o600;

/// What `write_chunk` did with the bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum Written {
    /// The file holds the bytes (fsynced when asked); their digest.
    Kept(String),
    /// The digest is not the expected one: the file was removed; the digest.
    Refused(String),
}

impl Written {
    /// The digest of the bytes, either way.
    pub fn digest(&self) -> &str {
        match self {
            Written::Kept(hex) | Written::Refused(hex) => hex,
        }
    }
}

/// Writes `data` to a new file at `path` (created 0600; an existing file is an
/// error, never overwritten) while hashing it with `algorithm`.
///
/// With `expected` (lowercase hex) and a digest that differs, the file is
/// removed and not fsynced (`Written::Refused`): nothing is left behind.
/// Otherwise the file is fsynced when `fsync` is set (`Written::Kept`). An I/O
/// error removes the file too: no partial file is ever left.
pub fn write_chunk(
    path: &Path,
    data: &[u8],
    algorithm: Algorithm,
    expected: Option<&str>,
    fsync: bool,
) -> Result<Written, MergeError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
        .map_err(|e| MergeError::io(None, path, "open", e))?;
    let outcome = fill(&mut file, path, data, algorithm, expected, fsync);
    drop(file);
    if !matches!(outcome, Ok(Written::Kept(_))) {
        remove(path)?;
    }
    outcome
}

fn fill(
    file: &mut File,
    path: &Path,
    data: &[u8],
    algorithm: Algorithm,
    expected: Option<&str>,
    fsync: bool,
) -> Result<Written, MergeError> {
    let mut hasher = Hasher::new(algorithm);
    for step in data.chunks(STEP) {
        hasher.update(step);
        file.write_all(step).map_err(|e| MergeError::io(None, path, "write", e))?;
    }
    let hex = hasher.finalize_hex();
    if expected.is_some_and(|want| want != hex) {
        return Ok(Written::Refused(hex));
    }
    if fsync {
        file.sync_all().map_err(|e| MergeError::io(None, path, "fsync", e))?;
    }
    Ok(Written::Kept(hex))
}

/// Removes `path`; one already gone is fine.
fn remove(path: &Path) -> Result<(), MergeError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(MergeError::io(None, path, "unlink", e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn folder(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("chunk_file_{name}_{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn writes_exactly_the_bytes_0600_and_returns_their_digest() {
        let dir = folder("kept");
        let data: Vec<u8> = (0..(STEP * 3 + 17)).map(|i| (i * 31 % 251) as u8).collect();
        for algorithm in Algorithm::ALL {
            let path = dir.join(algorithm.name());
            let mut want = Hasher::new(algorithm);
            want.update(&data);
            let want = want.finalize_hex();
            let written = write_chunk(&path, &data, algorithm, Some(&want), true).unwrap();
            assert_eq!(written, Written::Kept(want.clone()));
            assert_eq!(std::fs::read(&path).unwrap(), data);
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
            // Without an expected digest the file is kept as well.
            let other = dir.join(format!("{}-unchecked", algorithm.name()));
            assert_eq!(write_chunk(&other, &data, algorithm, None, false).unwrap(), Written::Kept(want));
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_mismatch_leaves_no_file() {
        let dir = folder("refused");
        let path = dir.join("c");
        let wrong = "0".repeat(64);
        let written = write_chunk(&path, b"abc", Algorithm::Sha256, Some(&wrong), true).unwrap();
        assert_eq!(
            written,
            Written::Refused("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".into())
        );
        assert!(!path.exists());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn never_overwrites_an_existing_file() {
        let dir = folder("exists");
        let path = dir.join("c");
        std::fs::write(&path, b"old").unwrap();
        let err = write_chunk(&path, b"new", Algorithm::Sha256, None, false).unwrap_err();
        assert!(matches!(err, MergeError::Io { op: "open", .. }), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
