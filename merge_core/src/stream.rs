//! The streaming merge: the same checks as `merge`, over bytes the caller
//! feeds instead of chunk files it reads (a chunk held in an object store).
//!
//! The caller reads chunks in index order (`next_index`), passes their bytes
//! through `update` (and on to wherever the output goes), closes each chunk
//! with `end_chunk` and the whole file with `finish`. Every chunk's size and
//! checksum, and the whole file's checksum, are checked exactly as `merge`
//! checks them, with the same errors; the caller publishes its output only
//! after `finish` returned `Ok`. Memory is the caller's blocks: nothing is
//! buffered here.
//!
//! The first error poisons the merge: later calls fail with
//! `InvalidArgument` (a caller's bug), never with a second verdict.

use crate::checksum::Algorithm;
use crate::chunk::{order_chunks, Chunk};
use crate::errors::MergeError;
use crate::pair_hasher::PairHasher;

/// What a verified streaming merge produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamOutcome {
    pub size: u64,
    /// The whole file's checksum, lowercase hex.
    pub checksum: String,
    pub algorithm: Algorithm,
    pub chunk_count: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Open,
    Failed,
    Finished,
}

/// An ordered, verified merge fed one block at a time (see the module docs).
pub struct StreamingMerge {
    chunks: Vec<Chunk>,
    algorithm: Algorithm,
    expected_checksum: Option<String>,
    hasher: PairHasher,
    /// Position (in index order) of the chunk the next bytes belong to.
    position: usize,
    /// Bytes of that chunk seen so far.
    in_chunk: u64,
    total: u64,
    state: State,
}

impl StreamingMerge {
    /// Orders `chunks` by index and checks the indexes are exactly `0..N-1`
    /// (`MissingChunk` / `DuplicateChunk`, before any byte) and that every
    /// checksum is well-formed hex. `path` of a chunk only names it in errors
    /// (an object key, say).
    pub fn new(
        chunks: Vec<Chunk>,
        algorithm: Algorithm,
        expected_checksum: Option<String>,
    ) -> Result<Self, MergeError> {
        let chunks = order_chunks(chunks, algorithm)?;
        let expected_checksum = expected_checksum.map(|hex| algorithm.normalize_hex(&hex)).transpose()?;
        Ok(StreamingMerge {
            chunks,
            algorithm,
            expected_checksum,
            hasher: PairHasher::new(algorithm),
            position: 0,
            in_chunk: 0,
            total: 0,
            state: State::Open,
        })
    }

    /// The index of the chunk the next bytes belong to (`None` once every
    /// chunk has ended).
    pub fn next_index(&self) -> Option<u64> {
        self.chunks.get(self.position).map(|c| c.index)
    }

    /// Bytes accepted so far.
    pub fn bytes_done(&self) -> u64 {
        self.total
    }

    /// Sum of the chunks' sizes: the merged file's size if it verifies.
    pub fn total_size(&self) -> u64 {
        self.chunks.iter().map(|c| c.size).sum()
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    fn open(&self) -> Result<(), MergeError> {
        match self.state {
            State::Open => Ok(()),
            State::Failed => Err(MergeError::InvalidArgument("the streaming merge already failed".into())),
            State::Finished => Err(MergeError::InvalidArgument("the streaming merge is finished".into())),
        }
    }

    fn fail<T>(&mut self, err: MergeError) -> Result<T, MergeError> {
        self.state = State::Failed;
        Err(err)
    }

    /// Hashes the next bytes of chunk `next_index()`. More bytes than the
    /// chunk's size fail at once with `ChunkSizeMismatch` (`actual` is the
    /// count seen so far, at least one past the size).
    pub fn update(&mut self, data: &[u8]) -> Result<(), MergeError> {
        self.open()?;
        let Some(chunk) = self.chunks.get(self.position) else {
            return self.fail(MergeError::InvalidArgument("bytes after the last chunk ended".into()));
        };
        let seen = self.in_chunk + data.len() as u64;
        if seen > chunk.size {
            let err = MergeError::ChunkSizeMismatch {
                index: chunk.index,
                path: chunk.path.clone(),
                expected: chunk.size,
                actual: seen,
            };
            return self.fail(err);
        }
        self.hasher.update(data);
        self.in_chunk = seen;
        self.total += data.len() as u64;
        Ok(())
    }

    /// Ends chunk `next_index()`: checks its size and checksum. Returns its index.
    pub fn end_chunk(&mut self) -> Result<u64, MergeError> {
        self.open()?;
        let Some(chunk) = self.chunks.get(self.position) else {
            return self.fail(MergeError::InvalidArgument("every chunk already ended".into()));
        };
        if self.in_chunk != chunk.size {
            let err = MergeError::ChunkSizeMismatch {
                index: chunk.index,
                path: chunk.path.clone(),
                expected: chunk.size,
                actual: self.in_chunk,
            };
            return self.fail(err);
        }
        let actual = self.hasher.finish_chunk();
        if actual != chunk.checksum {
            let err = MergeError::ChunkChecksumMismatch {
                index: chunk.index,
                path: chunk.path.clone(),
                expected: chunk.checksum.clone(),
                actual,
            };
            return self.fail(err);
        }
        let index = chunk.index;
        self.position += 1;
        self.in_chunk = 0;
        Ok(index)
    }

    /// Checks every chunk ended (else `MissingChunk`, the first one not fed)
    /// and the whole file's checksum against the expected one, if any.
    pub fn finish(&mut self) -> Result<StreamOutcome, MergeError> {
        self.open()?;
        if let Some(chunk) = self.chunks.get(self.position) {
            let err = MergeError::MissingChunk { index: chunk.index, count: self.chunks.len() as u64 };
            return self.fail(err);
        }
        let hasher = std::mem::replace(&mut self.hasher, PairHasher::new(self.algorithm));
        let checksum = hasher.finish_file();
        if let Some(expected) = &self.expected_checksum {
            if *expected != checksum {
                let err = MergeError::FileChecksumMismatch { expected: expected.clone(), actual: checksum };
                return self.fail(err);
            }
        }
        self.state = State::Finished;
        Ok(StreamOutcome {
            size: self.total,
            checksum,
            algorithm: self.algorithm,
            chunk_count: self.chunks.len() as u64,
        })
    }
}
