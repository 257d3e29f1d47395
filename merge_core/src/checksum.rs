//! Checksum algorithms: one streaming `Hasher` for chunks, whole files and the
//! upload service's on-receipt checks, so every party computes the same hex.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use sha2::Digest;

use crate::aligned::AlignedBuf;
use crate::errors::MergeError;

/// A supported checksum algorithm. Checksums cross the API as lowercase hex.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// SHA-256: the default, interoperable (`sha256sum`, `openssl dgst`).
    Sha256,
    /// BLAKE3 (32-byte output): fast and cryptographic.
    Blake3,
    /// CRC-32C (Castagnoli), as 8 hex digits of the big-endian value: fastest,
    /// detects corruption, not tampering.
    Crc32c,
}

impl Algorithm {
    pub const ALL: [Algorithm; 3] = [Algorithm::Sha256, Algorithm::Blake3, Algorithm::Crc32c];

    pub fn parse(name: &str) -> Result<Self, MergeError> {
        match name {
            "sha256" => Ok(Algorithm::Sha256),
            "blake3" => Ok(Algorithm::Blake3),
            "crc32c" => Ok(Algorithm::Crc32c),
            other => Err(MergeError::InvalidArgument(format!(
                "unknown checksum algorithm {other:?} (expected one of: sha256, blake3, crc32c)"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Sha256 => "sha256",
            Algorithm::Blake3 => "blake3",
            Algorithm::Crc32c => "crc32c",
        }
    }

    /// Length of the hex digest.
    pub fn hex_len(self) -> usize {
        match self {
            Algorithm::Sha256 | Algorithm::Blake3 => 64,
            Algorithm::Crc32c => 8,
        }
    }

    /// Checks that `hex` could be a digest of this algorithm and returns it in
    /// lowercase (callers may pass uppercase hex).
    pub fn normalize_hex(self, hex: &str) -> Result<String, MergeError> {
        if hex.len() != self.hex_len() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(MergeError::InvalidArgument(format!(
                "{hex:?} is not a {} checksum ({} hex digits)",
                self.name(),
                self.hex_len()
            )));
        }
        Ok(hex.to_ascii_lowercase())
    }
}

/// A streaming checksum: `update` any number of times, then `finalize_hex`.
#[derive(Clone)]
pub enum Hasher {
    Sha256(sha2::Sha256),
    Blake3(Box<blake3::Hasher>),
    Crc32c(u32),
}

impl Hasher {
    pub fn new(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::Sha256 => Hasher::Sha256(sha2::Sha256::new()),
            Algorithm::Blake3 => Hasher::Blake3(Box::new(blake3::Hasher::new())),
            Algorithm::Crc32c => Hasher::Crc32c(0),
        }
    }

    pub fn algorithm(&self) -> Algorithm {
        match self {
            Hasher::Sha256(_) => Algorithm::Sha256,
            Hasher::Blake3(_) => Algorithm::Blake3,
            Hasher::Crc32c(_) => Algorithm::Crc32c,
        }
    }

    pub fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(data),
            Hasher::Blake3(h) => {
                h.update(data);
            }
            Hasher::Crc32c(crc) => *crc = crc32c::crc32c_append(*crc, data),
        }
    }

    /// The digest so far, as lowercase hex; the hasher is left unchanged.
    pub fn hex(&self) -> String {
        match self {
            Hasher::Sha256(h) => to_hex(&h.clone().finalize()),
            Hasher::Blake3(h) => to_hex(h.finalize().as_bytes()),
            Hasher::Crc32c(crc) => format!("{crc:08x}"),
        }
    }

    /// The digest as lowercase hex, consuming the hasher.
    pub fn finalize_hex(self) -> String {
        match self {
            Hasher::Sha256(h) => to_hex(&h.finalize()),
            other => other.hex(),
        }
    }
}

pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
    out
}

/// One checksum of a whole file, read through a single 1 MiB aligned buffer.
/// Returns `(hex, size)`.
pub fn checksum_file(path: &Path, algorithm: Algorithm) -> Result<(String, u64), MergeError> {
    let mut file = File::open(path).map_err(|e| MergeError::io(None, path, "open", e))?;
    let mut buf = AlignedBuf::new(1 << 20);
    let mut hasher = Hasher::new(algorithm);
    let mut size = 0u64;
    loop {
        let n = match file.read(buf.as_mut_slice()) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(MergeError::io(None, path, "read", e)),
        };
        hasher.update(&buf.as_slice()[..n]);
        size += n as u64;
    }
    Ok((hasher.finalize_hex(), size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        let mut h = Hasher::new(Algorithm::Sha256);
        h.update(b"abc");
        assert_eq!(h.finalize_hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        let mut h = Hasher::new(Algorithm::Crc32c);
        h.update(b"123456789");
        assert_eq!(h.finalize_hex(), "e3069283");
        let h = Hasher::new(Algorithm::Blake3);
        assert_eq!(h.finalize_hex(), "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262");
    }

    #[test]
    fn streaming_equals_one_shot() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        for alg in Algorithm::ALL {
            let mut one = Hasher::new(alg);
            one.update(&data);
            let mut many = Hasher::new(alg);
            for piece in data.chunks(777) {
                many.update(piece);
            }
            assert_eq!(one.hex(), many.finalize_hex());
        }
    }

    #[test]
    fn parse_and_normalize() {
        assert!(Algorithm::parse("md5").is_err());
        let a = Algorithm::parse("crc32c").unwrap();
        assert_eq!(a.normalize_hex("E3069283").unwrap(), "e3069283");
        assert!(a.normalize_hex("e306928").is_err());
        assert!(a.normalize_hex("e306928g").is_err());
    }
}
