//! The per-chunk and whole-file checksums over the same bytes, fused into one
//! pass for sha256 (`sha256x2`).

use crate::checksum::{Algorithm, Hasher};
use crate::sha256x2::{self, Sha256Stream};

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
