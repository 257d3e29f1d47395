//! A chunk of an upload, and putting chunks in index order. Order comes from
//! `index` alone: never from file names or the order chunks were given in.

use std::path::PathBuf;

use crate::checksum::Algorithm;
use crate::errors::MergeError;

/// One chunk file to merge: where it is and what it must contain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub index: u64,
    pub path: PathBuf,
    /// Expected size in bytes.
    pub size: u64,
    /// Expected checksum, lowercase hex, of the merge's algorithm.
    pub checksum: String,
}

/// Sorts `chunks` by index and checks that the indexes are exactly `0..N-1`
/// and that every checksum is well-formed hex for `algorithm` (normalised to
/// lowercase). Errors name the lowest offending index.
pub fn order_chunks(mut chunks: Vec<Chunk>, algorithm: Algorithm) -> Result<Vec<Chunk>, MergeError> {
    chunks.sort_by_key(|c| c.index);
    let count = chunks.len() as u64;
    for (expected, chunk) in chunks.iter().enumerate() {
        let expected = expected as u64;
        if chunk.index > expected {
            return Err(MergeError::MissingChunk { index: expected, count });
        }
        if chunk.index < expected {
            return Err(MergeError::DuplicateChunk { index: chunk.index });
        }
    }
    for chunk in &mut chunks {
        chunk.checksum = algorithm.normalize_hex(&chunk.checksum).map_err(|_| {
            MergeError::InvalidArgument(format!(
                "chunk {}: {:?} is not a {} checksum ({} hex digits)",
                chunk.index,
                chunk.checksum,
                algorithm.name(),
                algorithm.hex_len()
            ))
        })?;
    }
    Ok(chunks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(index: u64) -> Chunk {
        Chunk { index, path: format!("c{index}").into(), size: 0, checksum: "00000000".into() }
    }

    fn order(indexes: &[u64]) -> Result<Vec<u64>, MergeError> {
        let chunks = indexes.iter().map(|&i| chunk(i)).collect();
        order_chunks(chunks, Algorithm::Crc32c).map(|v| v.into_iter().map(|c| c.index).collect())
    }

    #[test]
    fn sorts_by_index() {
        assert_eq!(order(&[2, 0, 3, 1]).unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(order(&[]).unwrap(), Vec::<u64>::new());
    }

    #[test]
    fn names_the_missing_index() {
        assert!(matches!(order(&[0, 2, 3]), Err(MergeError::MissingChunk { index: 1, count: 3 })));
        assert!(matches!(order(&[1]), Err(MergeError::MissingChunk { index: 0, .. })));
        assert!(matches!(order(&[0, 1, 5]), Err(MergeError::MissingChunk { index: 2, .. })));
    }

    #[test]
    fn names_the_duplicate_index() {
        assert!(matches!(order(&[0, 1, 1]), Err(MergeError::DuplicateChunk { index: 1 })));
        assert!(matches!(order(&[0, 0]), Err(MergeError::DuplicateChunk { index: 0 })));
        // The lowest problem wins: 1 is missing before 2 is duplicated.
        assert!(matches!(order(&[0, 2, 2]), Err(MergeError::MissingChunk { index: 1, .. })));
    }

    #[test]
    fn rejects_malformed_checksums() {
        let mut c = chunk(0);
        c.checksum = "xyz".into();
        assert!(matches!(order_chunks(vec![c], Algorithm::Crc32c), Err(MergeError::InvalidArgument(_))));
    }
}
