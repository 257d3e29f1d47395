//! Two SHA-256 streams over the same bytes, on one core.
//!
//! A merge hashes every byte twice: into its chunk's checksum and into the
//! whole file's. With SHA-NI one stream is bound by the latency of the
//! `sha256rnds2` chain, not by the core's throughput, so running the two
//! chains interleaved costs much less than twice one stream. The message
//! schedule depends only on the data, so it is computed once for both states.
//!
//! `Sha256Stream` is a plain streaming SHA-256 (state, partial block, length).
//! `update_both(a, b, data)` takes the fused path when both streams are at a
//! block boundary (always the case when chunk sizes before this one are
//! multiples of 64, e.g. 4 MiB chunks) and SHA-NI is available; otherwise it
//! updates each stream on its own (same result, just slower). The single
//! stream compression is `sha2`'s; the fused one is adapted from `sha2`'s
//! x86 SHA-NI backend (RustCrypto, MIT/Apache-2.0). Tests compare both with
//! `sha2` on random splits.

use sha2::block_api::compress256;

const H0: [u32; 8] =
    [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];

/// A streaming SHA-256 whose state the fused path can reach.
#[derive(Clone)]
pub struct Sha256Stream {
    state: [u32; 8],
    buf: [u8; 64],
    buf_len: usize,
    len: u64,
}

impl Default for Sha256Stream {
    fn default() -> Self {
        Self::new()
    }
}

impl Sha256Stream {
    pub fn new() -> Self {
        Sha256Stream { state: H0, buf: [0; 64], buf_len: 0, len: 0 }
    }

    pub fn update(&mut self, mut data: &[u8]) {
        self.len += data.len() as u64;
        if self.buf_len > 0 {
            let take = (64 - self.buf_len).min(data.len());
            self.buf[self.buf_len..self.buf_len + take].copy_from_slice(&data[..take]);
            self.buf_len += take;
            data = &data[take..];
            if self.buf_len < 64 {
                return;
            }
            compress256(&mut self.state, std::slice::from_ref(&self.buf));
            self.buf_len = 0;
        }
        let (blocks, tail) = data.as_chunks::<64>();
        compress256(&mut self.state, blocks);
        self.buf[..tail.len()].copy_from_slice(tail);
        self.buf_len = tail.len();
    }

    /// The digest as lowercase hex; the stream is left unchanged.
    pub fn hex(&self) -> String {
        let mut state = self.state;
        let bit_len = self.len.wrapping_mul(8);
        let mut block = [0u8; 64];
        block[..self.buf_len].copy_from_slice(&self.buf[..self.buf_len]);
        block[self.buf_len] = 0x80;
        if self.buf_len >= 56 {
            compress256(&mut state, std::slice::from_ref(&block));
            block = [0u8; 64];
        }
        block[56..].copy_from_slice(&bit_len.to_be_bytes());
        compress256(&mut state, std::slice::from_ref(&block));
        let mut out = [0u8; 32];
        for (o, w) in out.chunks_exact_mut(4).zip(state) {
            o.copy_from_slice(&w.to_be_bytes());
        }
        crate::checksum::to_hex(&out)
    }
}

/// Hashes `data` into both streams (as `a.update(data); b.update(data)`).
pub fn update_both(a: &mut Sha256Stream, b: &mut Sha256Stream, data: &[u8]) {
    if a.buf_len != 0 || b.buf_len != 0 || data.len() < 64 || !x86::available() {
        a.update(data);
        b.update(data);
        return;
    }
    let (blocks, tail) = data.as_chunks::<64>();
    let body = blocks.len() * 64;
    x86::compress2(&mut a.state, &mut b.state, blocks);
    a.len += body as u64;
    b.len += body as u64;
    a.update(tail);
    b.update(tail);
}

/// Whether `update_both` runs the fused SHA-NI path on this CPU.
pub fn fused_available() -> bool {
    x86::available()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    pub fn available() -> bool {
        use std::sync::OnceLock;
        static YES: OnceLock<bool> = OnceLock::new();
        *YES.get_or_init(|| {
            is_x86_feature_detected!("sha")
                && is_x86_feature_detected!("sse4.1")
                && is_x86_feature_detected!("ssse3")
        })
    }

    pub fn compress2(a: &mut [u32; 8], b: &mut [u32; 8], blocks: &[[u8; 64]]) {
        assert!(available());
        // SAFETY: the CPU features were checked just above.
        unsafe { compress2_ni(a, b, blocks) }
    }

    static K32: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
    ];

    /// Four rounds on both states with the same scheduled words.
    #[inline(always)]
    unsafe fn rounds4(r: usize, s: &mut [(__m128i, __m128i); 2], w: __m128i) {
        let k = _mm_loadu_si128(K32.as_ptr().add(4 * r).cast());
        let t1 = _mm_add_epi32(w, k);
        let t2 = _mm_shuffle_epi32(t1, 0x0E);
        let [(a0, c0), (a1, c1)] = *s;
        let c0 = _mm_sha256rnds2_epu32(c0, a0, t1);
        let c1 = _mm_sha256rnds2_epu32(c1, a1, t1);
        let a0 = _mm_sha256rnds2_epu32(a0, c0, t2);
        let a1 = _mm_sha256rnds2_epu32(a1, c1, t2);
        *s = [(a0, c0), (a1, c1)];
    }

    #[inline(always)]
    unsafe fn load_state(state: &[u32; 8]) -> (__m128i, __m128i) {
        let dcba = _mm_loadu_si128(state.as_ptr().cast());
        let hgfe = _mm_loadu_si128(state.as_ptr().add(4).cast());
        let cdab = _mm_shuffle_epi32(dcba, 0xB1);
        let efgh = _mm_shuffle_epi32(hgfe, 0x1B);
        (_mm_alignr_epi8(cdab, efgh, 8), _mm_blend_epi16(efgh, cdab, 0xF0))
    }

    #[inline(always)]
    unsafe fn store_state(state: &mut [u32; 8], (abef, cdgh): (__m128i, __m128i)) {
        let feba = _mm_shuffle_epi32(abef, 0x1B);
        let dchg = _mm_shuffle_epi32(cdgh, 0xB1);
        _mm_storeu_si128(state.as_mut_ptr().cast(), _mm_blend_epi16(feba, dchg, 0xF0));
        _mm_storeu_si128(state.as_mut_ptr().add(4).cast(), _mm_alignr_epi8(dchg, feba, 8));
    }

    #[target_feature(enable = "sha,sse4.1,ssse3")]
    unsafe fn compress2_ni(a: &mut [u32; 8], b: &mut [u32; 8], blocks: &[[u8; 64]]) {
        let mask = _mm_set_epi64x(0x0C0D_0E0F_0809_0A0B, 0x0405_0607_0001_0203);
        let mut s = [load_state(a), load_state(b)];
        for block in blocks {
            let saved = s;
            let p: *const __m128i = block.as_ptr().cast();
            let mut w = [0, 1, 2, 3].map(|i| _mm_shuffle_epi8(_mm_loadu_si128(p.add(i)), mask));
            for (r, &wr) in w.iter().enumerate() {
                rounds4(r, &mut s, wr);
            }
            for r in (4..16).step_by(4) {
                for i in 0..4 {
                    let t1 = _mm_sha256msg1_epu32(w[i], w[(i + 1) % 4]);
                    let t2 = _mm_alignr_epi8(w[(i + 3) % 4], w[(i + 2) % 4], 4);
                    w[i] = _mm_sha256msg2_epu32(_mm_add_epi32(t1, t2), w[(i + 3) % 4]);
                    rounds4(r + i, &mut s, w[i]);
                }
            }
            for (cur, old) in s.iter_mut().zip(saved) {
                cur.0 = _mm_add_epi32(cur.0, old.0);
                cur.1 = _mm_add_epi32(cur.1, old.1);
            }
        }
        store_state(a, s[0]);
        store_state(b, s[1]);
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod x86 {
    pub fn available() -> bool {
        false
    }

    pub fn compress2(_: &mut [u32; 8], _: &mut [u32; 8], _: &[[u8; 64]]) {
        unreachable!("fused path needs x86_64 SHA-NI")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;

    fn reference(data: &[u8]) -> String {
        crate::checksum::to_hex(&sha2::Sha256::digest(data))
    }

    #[test]
    fn single_stream_matches_sha2() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 131 % 251) as u8).collect();
        for len in [0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 1000, 5000] {
            for split in [0, 1, 63, 64, 100] {
                let split = split.min(len);
                let mut s = Sha256Stream::new();
                s.update(&data[..split]);
                s.update(&data[split..len]);
                assert_eq!(s.hex(), reference(&data[..len]), "len {len} split {split}");
            }
        }
    }

    #[test]
    fn fused_matches_two_streams() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        // The whole-file stream starts at various offsets (aligned and not).
        for prefix in [0usize, 64, 7, 128, 1] {
            let mut file = Sha256Stream::new();
            file.update(&data[..prefix]);
            let mut chunk = Sha256Stream::new();
            let mut at = prefix;
            for piece in [1usize, 64, 4096, 100_000, 33, 64 * 1000, 12345] {
                let end = (at + piece).min(data.len());
                update_both(&mut chunk, &mut file, &data[at..end]);
                at = end;
            }
            assert_eq!(chunk.hex(), reference(&data[prefix..at]));
            assert_eq!(file.hex(), reference(&data[..at]));
        }
    }

    #[test]
    fn fused_path_on_block_boundaries() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i.wrapping_mul(40_503) >> 7) as u8).collect();
        for prefix in [0usize, 64, 640] {
            let mut file = Sha256Stream::new();
            file.update(&data[..prefix]);
            let mut chunk = Sha256Stream::new();
            let mut at = prefix;
            for piece in [640usize, 4096, 64 * 1000, 64, 33] {
                update_both(&mut chunk, &mut file, &data[at..at + piece]);
                at += piece;
            }
            assert_eq!(chunk.hex(), reference(&data[prefix..at]));
            assert_eq!(file.hex(), reference(&data[..at]));
        }
    }

    fn cpu_seconds() -> f64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: plain syscall writing into a local.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }

    /// `cargo test --release --lib sha_speed -- --ignored --nocapture`
    /// (thread CPU time, so other load on the machine matters less).
    #[test]
    #[ignore]
    fn sha_speed() {
        let data = vec![7u8; 64 << 20];
        let mb = data.len() as f64 / 1e6;
        let (mut one, mut both, mut sep) = (f64::MAX, f64::MAX, f64::MAX);
        for _ in 0..7 {
            let t = cpu_seconds();
            let mut a = Sha256Stream::new();
            a.update(&data);
            one = one.min(cpu_seconds() - t);
            let t = cpu_seconds();
            let (mut a, mut b) = (Sha256Stream::new(), Sha256Stream::new());
            update_both(&mut a, &mut b, &data);
            both = both.min(cpu_seconds() - t);
            let t = cpu_seconds();
            let (mut a, mut b) = (Sha256Stream::new(), Sha256Stream::new());
            a.update(&data);
            b.update(&data);
            sep = sep.min(cpu_seconds() - t);
        }
        println!(
            "one stream {:.0} MB/s; two streams fused {:.0} MB/s, separately {:.0} MB/s (fused: {})",
            mb / one,
            mb / both,
            mb / sep,
            fused_available()
        );
    }
}
