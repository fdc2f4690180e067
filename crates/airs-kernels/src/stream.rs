//! A streaming read of a byte buffer at the memory limit: the kernel of the read-bandwidth
//! probe that `airs bench decode` runs beside its decode, so achieved weight bandwidth is
//! compared with what this machine delivers to the same threads in the same minute.
//!
//! What: [`xor_fold`] XORs the buffer's little-endian 64-bit words together (a tail shorter
//! than 8 bytes is zero-padded). XOR is associative and commutative, so every SIMD variant
//! returns exactly the scalar reference's value whatever its lane and accumulator order — the
//! test compares them — and the result depends on every byte, so no load can be optimized
//! away.
//!
//! Where the design comes from: STREAM-style probes and the throwaway C probe used for the
//! peer comparisons (several independent streams of full-width loads per thread, no stores).
//! Cost: one vector load and one XOR per 64 bytes on AVX-512 (32 on AVX2, 16 on NEON), in
//! eight independent accumulators so that loads, not the XOR chain, set the pace.

use crate::Isa;

/// The XOR of `bytes` read as little-endian u64 words (the tail zero-padded).
pub fn xor_fold(isa: Isa, bytes: &[u8]) -> u64 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if Isa::Avx512.is_available() => {
            // SAFETY: AVX-512 F is available (checked in the guard).
            unsafe { x86::xor_fold_avx512(bytes) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 if Isa::Avx2.is_available() => {
            // SAFETY: AVX2 is available (checked in the guard).
            unsafe { x86::xor_fold_avx2(bytes) }
        }
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::xor_fold(bytes),
        _ => xor_fold_scalar(bytes),
    }
}

/// The scalar reference of [`xor_fold`].
fn xor_fold_scalar(bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(8);
    let mut acc = 0u64;
    for w in &mut words {
        acc ^= u64::from_le_bytes(w.try_into().expect("8-byte chunk"));
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        let mut last = [0u8; 8];
        last[..tail.len()].copy_from_slice(tail);
        acc ^= u64::from_le_bytes(last);
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Bytes per iteration: eight independent 64-byte streams.
    const STEP512: usize = 8 * 64;

    /// # Safety
    /// The CPU must support AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn xor_fold_avx512(bytes: &[u8]) -> u64 {
        // Four streams at quarter offsets, two lines each per iteration: several hardware
        // prefetch streams in flight per core, as one sequential stream leaves DRAM idle.
        let quarter = bytes.len() / STEP512 * (STEP512 / 4);
        let body = 4 * quarter;
        let mut acc = [_mm512_setzero_si512(); 8];
        let p = bytes.as_ptr();
        let mut off = 0;
        while off < quarter {
            for (k, a) in acc.iter_mut().enumerate() {
                let at = (k / 2) * quarter + off + 64 * (k % 2);
                // SAFETY: at + 64 ≤ 3·quarter + quarter = body ≤ bytes.len() (off + 128 ≤
                // quarter, a multiple of 128); unaligned loads are allowed.
                let v = unsafe { _mm512_loadu_si512(p.add(at).cast()) };
                *a = _mm512_xor_si512(*a, v);
            }
            off += 128;
        }
        let mut all = acc[0];
        for a in &acc[1..] {
            all = _mm512_xor_si512(all, *a);
        }
        let mut lanes = [0u64; 8];
        // SAFETY: `lanes` is 64 writable bytes.
        unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), all) };
        lanes
            .iter()
            .fold(super::xor_fold_scalar(&bytes[body..]), |x, l| x ^ l)
    }

    /// Bytes per iteration: eight independent 32-byte streams.
    const STEP256: usize = 8 * 32;

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn xor_fold_avx2(bytes: &[u8]) -> u64 {
        let body = bytes.len() / STEP256 * STEP256;
        let mut acc = [_mm256_setzero_si256(); 8];
        let p = bytes.as_ptr();
        let mut off = 0;
        while off < body {
            for (k, a) in acc.iter_mut().enumerate() {
                // SAFETY: off + 32·k + 32 ≤ body ≤ bytes.len(); unaligned loads are allowed.
                let v = unsafe { _mm256_loadu_si256(p.add(off + 32 * k).cast()) };
                *a = _mm256_xor_si256(*a, v);
            }
            off += STEP256;
        }
        let mut all = acc[0];
        for a in &acc[1..] {
            all = _mm256_xor_si256(all, *a);
        }
        let mut lanes = [0u64; 4];
        // SAFETY: `lanes` is 32 writable bytes.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), all) };
        lanes
            .iter()
            .fold(super::xor_fold_scalar(&bytes[body..]), |x, l| x ^ l)
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    /// Bytes per iteration: eight independent 16-byte streams.
    const STEP: usize = 8 * 16;

    pub(super) fn xor_fold(bytes: &[u8]) -> u64 {
        let body = bytes.len() / STEP * STEP;
        // SAFETY: Advanced SIMD is part of the aarch64 baseline; every load below reads 16
        // bytes at off + 16·k + 16 ≤ body ≤ bytes.len().
        unsafe {
            let mut acc = [vdupq_n_u64(0); 8];
            let p = bytes.as_ptr();
            let mut off = 0;
            while off < body {
                for (k, a) in acc.iter_mut().enumerate() {
                    let v = vreinterpretq_u64_u8(vld1q_u8(p.add(off + 16 * k)));
                    *a = veorq_u64(*a, v);
                }
                off += STEP;
            }
            let mut all = acc[0];
            for a in &acc[1..] {
                all = veorq_u64(all, *a);
            }
            let lanes = vgetq_lane_u64::<0>(all) ^ vgetq_lane_u64::<1>(all);
            lanes ^ super::xor_fold_scalar(&bytes[body..])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_isa_folds_to_the_scalar_value_at_every_length_and_offset() {
        let bytes: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for isa in Isa::all_available() {
            for start in [0, 1, 7, 64] {
                for len in [0, 1, 7, 8, 9, 63, 511, 512, 513, 1024, 4000] {
                    let s = &bytes[start..start + len];
                    assert_eq!(
                        xor_fold(isa, s),
                        xor_fold_scalar(s),
                        "{isa:?} {start} {len}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_changed_byte_changes_the_fold() {
        let mut bytes = vec![0u8; 4096];
        let before = xor_fold(Isa::detect(), &bytes);
        bytes[3001] = 1;
        assert_ne!(xor_fold(Isa::detect(), &bytes), before);
    }
}
