//! The streaming merge: same verdicts as the file merge over fed bytes.

use _merge_core::checksum::{Algorithm, Hasher};
use _merge_core::chunk::Chunk;
use _merge_core::errors::MergeError;
use _merge_core::stream::StreamingMerge;

fn hex(alg: Algorithm, data: &[u8]) -> String {
    let mut h = Hasher::new(alg);
    h.update(data);
    h.finalize_hex()
}

fn data(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
}

/// Chunks given in reverse order (order must come from `index`) and their bytes.
fn chunks(sizes: &[usize], alg: Algorithm) -> (Vec<Chunk>, Vec<Vec<u8>>) {
    let bytes: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| data(i, n)).collect();
    let mut specs: Vec<Chunk> = bytes
        .iter()
        .enumerate()
        .map(|(i, b)| Chunk {
            index: i as u64,
            path: format!("uploads/u/{i}").into(),
            size: b.len() as u64,
            checksum: hex(alg, b),
        })
        .collect();
    specs.reverse();
    (specs, bytes)
}

/// Feeds every chunk in `block`-sized pieces, in index order.
fn feed_all(merge: &mut StreamingMerge, bytes: &[Vec<u8>], block: usize) -> Result<(), MergeError> {
    for (i, b) in bytes.iter().enumerate() {
        assert_eq!(merge.next_index(), Some(i as u64));
        for piece in b.chunks(block.max(1)) {
            merge.update(piece)?;
        }
        assert_eq!(merge.end_chunk()?, i as u64);
    }
    Ok(())
}

#[test]
fn verifies_and_matches_the_whole_file_checksum_for_every_algorithm() {
    for alg in Algorithm::ALL {
        let (specs, bytes) = chunks(&[1000, 4096, 0, 77], alg);
        let whole: Vec<u8> = bytes.concat();
        let mut merge = StreamingMerge::new(specs, alg, Some(hex(alg, &whole).to_uppercase())).unwrap();
        assert_eq!(merge.total_size(), whole.len() as u64);
        feed_all(&mut merge, &bytes, 333).unwrap();
        assert_eq!(merge.next_index(), None);
        let out = merge.finish().unwrap();
        assert_eq!(out.size, whole.len() as u64);
        assert_eq!(out.checksum, hex(alg, &whole));
        assert_eq!(out.chunk_count, 4);
        assert_eq!(out.algorithm, alg);
    }
}

#[test]
fn no_chunks_is_the_empty_file() {
    let mut merge = StreamingMerge::new(vec![], Algorithm::Sha256, None).unwrap();
    assert_eq!(merge.next_index(), None);
    let out = merge.finish().unwrap();
    assert_eq!((out.size, out.checksum), (0, hex(Algorithm::Sha256, b"")));
}

#[test]
fn missing_and_duplicate_indexes_fail_before_any_byte() {
    let (mut specs, _) = chunks(&[10, 10, 10], Algorithm::Sha256);
    specs.retain(|c| c.index != 1);
    match StreamingMerge::new(specs, Algorithm::Sha256, None) {
        Err(MergeError::MissingChunk { index: 1, .. }) => {}
        other => panic!("expected MissingChunk 1, got {:?}", other.err()),
    }
    let (mut specs, _) = chunks(&[10, 10], Algorithm::Sha256);
    specs.push(specs[0].clone());
    match StreamingMerge::new(specs, Algorithm::Sha256, None) {
        Err(MergeError::DuplicateChunk { index }) => assert!(index <= 1),
        other => panic!("expected DuplicateChunk, got {:?}", other.err()),
    }
}

#[test]
fn a_corrupt_chunk_is_named_and_poisons_the_merge() {
    let (specs, mut bytes) = chunks(&[100, 100, 100], Algorithm::Blake3);
    bytes[1][50] ^= 1;
    let mut merge = StreamingMerge::new(specs, Algorithm::Blake3, None).unwrap();
    match feed_all(&mut merge, &bytes, 64) {
        Err(MergeError::ChunkChecksumMismatch { index: 1, path, expected, actual }) => {
            assert_eq!(path.to_str(), Some("uploads/u/1"));
            assert_ne!(expected, actual);
        }
        other => panic!("expected ChunkChecksumMismatch 1, got {other:?}"),
    }
    assert!(matches!(merge.update(b"x"), Err(MergeError::InvalidArgument(_))));
    assert!(matches!(merge.finish(), Err(MergeError::InvalidArgument(_))));
}

#[test]
fn too_many_bytes_fail_at_once_and_too_few_at_the_chunk_end() {
    let (specs, bytes) = chunks(&[10, 10], Algorithm::Crc32c);
    let mut merge = StreamingMerge::new(specs.clone(), Algorithm::Crc32c, None).unwrap();
    merge.update(&bytes[0][..6]).unwrap();
    match merge.update(&[0u8; 5]) {
        Err(MergeError::ChunkSizeMismatch { index: 0, expected: 10, actual: 11, .. }) => {}
        other => panic!("expected ChunkSizeMismatch, got {other:?}"),
    }
    let mut merge = StreamingMerge::new(specs, Algorithm::Crc32c, None).unwrap();
    merge.update(&bytes[0][..9]).unwrap();
    match merge.end_chunk() {
        Err(MergeError::ChunkSizeMismatch { index: 0, expected: 10, actual: 9, .. }) => {}
        other => panic!("expected ChunkSizeMismatch, got {other:?}"),
    }
}

#[test]
fn a_chunk_never_fed_is_missing_at_finish() {
    let (specs, bytes) = chunks(&[10, 10], Algorithm::Sha256);
    let mut merge = StreamingMerge::new(specs, Algorithm::Sha256, None).unwrap();
    merge.update(&bytes[0]).unwrap();
    merge.end_chunk().unwrap();
    match merge.finish() {
        Err(MergeError::MissingChunk { index: 1, count: 2 }) => {}
        other => panic!("expected MissingChunk 1, got {other:?}"),
    }
}

#[test]
fn a_wrong_whole_file_checksum_fails_at_finish() {
    let (specs, bytes) = chunks(&[10, 20], Algorithm::Sha256);
    let wrong = hex(Algorithm::Sha256, b"something else");
    let mut merge = StreamingMerge::new(specs, Algorithm::Sha256, Some(wrong.clone())).unwrap();
    feed_all(&mut merge, &bytes, 7).unwrap();
    match merge.finish() {
        Err(MergeError::FileChecksumMismatch { expected, actual }) => {
            assert_eq!(expected, wrong);
            assert_eq!(actual, hex(Algorithm::Sha256, &bytes.concat()));
        }
        other => panic!("expected FileChecksumMismatch, got {other:?}"),
    }
}

#[test]
fn a_malformed_expected_checksum_is_invalid_argument() {
    let (specs, _) = chunks(&[10], Algorithm::Sha256);
    assert!(matches!(
        StreamingMerge::new(specs, Algorithm::Sha256, Some("zz".into())),
        Err(MergeError::InvalidArgument(_))
    ));
}
