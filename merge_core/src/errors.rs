//! The merge's error type: one enum, one variant per Python exception.
//!
//! The Python names (`MergeError` root and its subclasses) are made in
//! `bindings/errors.rs`; this file has no Python in it so `cargo test` links
//! without libpython.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Why a merge (or a checksum of a file) failed.
#[derive(Debug)]
pub enum MergeError {
    /// A chunk's bytes hash to `actual`, not the `expected` checksum.
    ChunkChecksumMismatch { index: u64, path: PathBuf, expected: String, actual: String },
    /// A chunk holds `actual` bytes, not the `expected` size.
    ChunkSizeMismatch { index: u64, path: PathBuf, expected: u64, actual: u64 },
    /// The indexes are not `0..N-1`: `index` is the lowest one absent.
    MissingChunk { index: u64, count: u64 },
    /// `index` is named by more than one chunk.
    DuplicateChunk { index: u64 },
    /// The merged file hashes to `actual`, not the caller's `expected`.
    FileChecksumMismatch { expected: String, actual: String },
    /// An operating-system error on `path` (a chunk when `index` is set).
    Io { index: Option<u64>, path: PathBuf, op: &'static str, source: io::Error },
    /// Bad arguments: unknown algorithm, malformed checksum string.
    InvalidArgument(String),
    /// The caller asked to stop (a Python exception from the progress callback
    /// or a signal); the bindings re-raise the stored Python error.
    Interrupted,
}

impl MergeError {
    pub fn io(index: Option<u64>, path: impl Into<PathBuf>, op: &'static str, source: io::Error) -> Self {
        MergeError::Io { index, path: path.into(), op, source }
    }

    /// The chunk index the error is about, if any.
    pub fn index(&self) -> Option<u64> {
        match self {
            MergeError::ChunkChecksumMismatch { index, .. }
            | MergeError::ChunkSizeMismatch { index, .. }
            | MergeError::MissingChunk { index, .. }
            | MergeError::DuplicateChunk { index } => Some(*index),
            MergeError::Io { index, .. } => *index,
            _ => None,
        }
    }
}

impl fmt::Display for MergeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MergeError::ChunkChecksumMismatch { index, path, expected, actual } => write!(
                f,
                "chunk {index} ({}): checksum mismatch: expected {expected}, got {actual}",
                path.display()
            ),
            MergeError::ChunkSizeMismatch { index, path, expected, actual } => write!(
                f,
                "chunk {index} ({}): size mismatch: expected {expected} bytes, got {actual}",
                path.display()
            ),
            MergeError::MissingChunk { index, count } => {
                write!(
                    f,
                    "chunk {index} is missing (indexes must be exactly 0 to {})",
                    count.saturating_sub(1)
                )
            }
            MergeError::DuplicateChunk { index } => write!(f, "chunk {index} is given more than once"),
            MergeError::FileChecksumMismatch { expected, actual } => {
                write!(f, "merged file checksum mismatch: expected {expected}, got {actual}")
            }
            MergeError::Io { index: Some(index), path, op, source } => {
                write!(f, "chunk {index}: cannot {op} {}: {source}", path.display())
            }
            MergeError::Io { index: None, path, op, source } => {
                write!(f, "cannot {op} {}: {source}", path.display())
            }
            MergeError::InvalidArgument(msg) => f.write_str(msg),
            MergeError::Interrupted => f.write_str("merge interrupted"),
        }
    }
}

impl std::error::Error for MergeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            MergeError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
