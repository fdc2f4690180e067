//! A compute probe: int8 dot products at the rate this CPU's widest int8 dot instruction
//! sustains, so a benchmark can say what fraction of the machine's arithmetic a batched step
//! uses (as the read-bandwidth probe, [`crate::xor_fold`], says it for decode's weight stream).
//! Batched decode of many sequences is bound by it: every weight byte is multiplied with each
//! sequence's activation byte by the same instruction the probe repeats.
//!
//! What: [`int8_dot_rounds`] runs [`CHAINS`] independent accumulator chains for `rounds`
//! rounds; a round adds to every chain the dot products of its 64 unsigned bytes with 64 signed
//! weight bytes, four bytes per 32-bit lane (`vpdpbusd` on AVX-512 VNNI, `sdot` on NEON with
//! the dot-product extension, `vpmaddubsw` + `vpmaddwd` + `vpaddd` on AVX2, as the matrix
//! kernels compute them on each). The lanes wrap as the instructions do, so every path returns
//! exactly the scalar reference's value (the test compares them), and the result depends on
//! every round. The activation bytes stay below 128, so `sdot`'s signed reading agrees.
//!
//! Where the design comes from: peak-FLOP microbenchmarks (independent chains, enough of them
//! to hide the instruction's latency). Cost: [`MACS_PER_ROUND`] multiply-adds per round and no
//! memory traffic; the caller chooses the duration through `rounds`.

use crate::Isa;

/// Independent accumulator chains (12 covers a 4-5 cycle latency at two instructions a cycle).
pub const CHAINS: usize = 12;
/// Bytes each chain multiplies per round.
const CHAIN_BYTES: usize = 64;
/// Multiply-accumulates of one round over all chains.
pub const MACS_PER_ROUND: u64 = (CHAINS * CHAIN_BYTES) as u64;

/// Chain `c`'s activation bytes (all below 128).
fn activations(c: usize) -> [u8; CHAIN_BYTES] {
    std::array::from_fn(|i| ((7 * c + 3 * i) % 128) as u8)
}

/// The weight bytes every chain multiplies (−32..31).
fn weights() -> [i8; CHAIN_BYTES] {
    std::array::from_fn(|i| ((5 * i) % 64) as i8 - 32)
}

/// `rounds` rounds of the probe on `isa`'s int8 dot instruction; returns the sum of every
/// chain's lanes (each wrapped to 32 bits, as the instructions wrap).
pub fn int8_dot_rounds(isa: Isa, rounds: u64) -> i64 {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::legacy::has_avx512_vnni(isa) {
            // SAFETY: AVX-512 F/BW/VL/VNNI were detected (`has_avx512_vnni`).
            return unsafe { x86::vnni(rounds) };
        }
        if matches!(isa, Isa::Avx2 | Isa::Avx512) && Isa::Avx2.is_available() {
            // SAFETY: AVX2 was detected just above.
            return unsafe { x86::avx2(rounds) };
        }
    }
    #[cfg(target_arch = "aarch64")]
    if crate::legacy::has_neon_dotprod(isa) {
        // SAFETY: NEON with the dot-product extension was detected (`has_neon_dotprod`).
        return unsafe { neon::sdot(rounds) };
    }
    int8_dot_rounds_scalar(rounds)
}

/// The scalar reference of [`int8_dot_rounds`].
fn int8_dot_rounds_scalar(rounds: u64) -> i64 {
    let w = weights();
    (0..CHAINS)
        .map(|c| {
            let a = activations(c);
            let mut lanes = [0i32; CHAIN_BYTES / 4];
            for _ in 0..rounds {
                for (l, lane) in lanes.iter_mut().enumerate() {
                    let dot: i32 = (4 * l..4 * l + 4)
                        .map(|i| i32::from(a[i]) * i32::from(w[i]))
                        .sum();
                    *lane = lane.wrapping_add(dot);
                }
            }
            lanes.iter().map(|&l| i64::from(l)).sum::<i64>()
        })
        .sum()
}

/// The sum of the 32-bit lanes of `bytes` (little-endian).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn lane_sum(bytes: &[u8]) -> i64 {
    bytes
        .chunks_exact(4)
        .map(|l| i64::from(i32::from_le_bytes(l.try_into().expect("4-byte lane"))))
        .sum()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{CHAIN_BYTES, CHAINS, activations, lane_sum, weights};

    /// # Safety
    /// The CPU must support AVX-512 F/BW/VL/VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn vnni(rounds: u64) -> i64 {
        let w_bytes = weights();
        // SAFETY: 64-byte arrays; unaligned loads are allowed.
        let w = unsafe { _mm512_loadu_si512(w_bytes.as_ptr().cast()) };
        let mut a = [_mm512_setzero_si512(); CHAINS];
        for (c, a) in a.iter_mut().enumerate() {
            let bytes = activations(c);
            // SAFETY: as above.
            *a = unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) };
        }
        let mut acc = [_mm512_setzero_si512(); CHAINS];
        for _ in 0..rounds {
            for (acc, &a) in acc.iter_mut().zip(&a) {
                *acc = _mm512_dpbusd_epi32(*acc, a, w);
            }
        }
        let mut sum = 0;
        for acc in acc {
            let mut lanes = [0u8; CHAIN_BYTES];
            // SAFETY: `lanes` is 64 writable bytes.
            unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), acc) };
            sum += lane_sum(&lanes);
        }
        sum
    }

    /// Chains per pass on AVX2 (two 32-byte halves each: 6 accumulators, 6 activation
    /// registers, the weights and the ones fit the 16 registers).
    const AVX2_PASS: usize = 3;

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn avx2(rounds: u64) -> i64 {
        let w_bytes = weights();
        // SAFETY: 64-byte arrays, read as two 32-byte halves; unaligned loads are allowed.
        let w = unsafe {
            [
                _mm256_loadu_si256(w_bytes.as_ptr().cast()),
                _mm256_loadu_si256(w_bytes.as_ptr().add(32).cast()),
            ]
        };
        let ones = _mm256_set1_epi16(1);
        let mut sum = 0;
        for pass in 0..CHAINS / AVX2_PASS {
            let mut a = [[_mm256_setzero_si256(); 2]; AVX2_PASS];
            for (k, a) in a.iter_mut().enumerate() {
                let bytes = activations(pass * AVX2_PASS + k);
                for (h, a) in a.iter_mut().enumerate() {
                    // SAFETY: as above.
                    *a = unsafe { _mm256_loadu_si256(bytes.as_ptr().add(32 * h).cast()) };
                }
            }
            let mut acc = [[_mm256_setzero_si256(); 2]; AVX2_PASS];
            for _ in 0..rounds {
                for (acc, a) in acc.iter_mut().zip(&mut a) {
                    for ((acc, a), &w) in acc.iter_mut().zip(a.iter_mut()).zip(&w) {
                        // An empty asm that "changes" `a`: the products are loop-invariant,
                        // and would otherwise be hoisted out of the loop.
                        // SAFETY: no instruction is emitted; the register is left as is.
                        unsafe {
                            std::arch::asm!(
                                "/* {0} */",
                                inout(ymm_reg) * a,
                                options(pure, nomem, nostack, preserves_flags)
                            )
                        };
                        // Pairs of |a·w| ≤ 2·127·32 fit i16: `vpmaddubsw` never saturates.
                        let pairs = _mm256_maddubs_epi16(*a, w);
                        *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(pairs, ones));
                    }
                }
            }
            for acc in acc.iter().flatten() {
                let mut lanes = [0u8; 32];
                // SAFETY: `lanes` is 32 writable bytes.
                unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), *acc) };
                sum += lane_sum(&lanes);
            }
        }
        sum
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    use super::{CHAINS, activations, lane_sum, weights};

    /// Chains per pass on NEON (four 16-byte quarters each: 12 accumulators and 12 activation
    /// registers, besides the 4 of weights, fit the 32 registers).
    const PASS: usize = 3;

    /// # Safety
    /// The CPU must support NEON with the dot-product extension.
    #[target_feature(enable = "neon,dotprod")]
    pub(super) unsafe fn sdot(rounds: u64) -> i64 {
        let w_bytes = weights();
        // SAFETY: 64-byte arrays, read as four 16-byte quarters.
        let w: [int8x16_t; 4] =
            std::array::from_fn(|q| unsafe { vld1q_s8(w_bytes.as_ptr().add(16 * q)) });
        let mut sum = 0;
        for pass in 0..CHAINS / PASS {
            let mut a = [[vdupq_n_s8(0); 4]; PASS];
            for (k, a) in a.iter_mut().enumerate() {
                let bytes = activations(pass * PASS + k);
                for (q, a) in a.iter_mut().enumerate() {
                    // SAFETY: as above; the bytes are below 128, so reading them signed
                    // changes nothing.
                    *a = unsafe { vld1q_s8(bytes.as_ptr().add(16 * q).cast()) };
                }
            }
            let mut acc = [[vdupq_n_s32(0); 4]; PASS];
            for _ in 0..rounds {
                for (acc, a) in acc.iter_mut().zip(&a) {
                    for ((acc, &a), &w) in acc.iter_mut().zip(a).zip(&w) {
                        *acc = crate::tiled::neon::sdot(*acc, a, w);
                    }
                }
            }
            for acc in acc.iter().flatten() {
                let mut lanes = [0u8; 16];
                // SAFETY: `lanes` is 16 writable bytes.
                unsafe { vst1q_s32(lanes.as_mut_ptr().cast(), *acc) };
                sum += lane_sum(&lanes);
            }
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference's value in closed form: each lane gains the same dot every round, so
    /// after `rounds` it holds `rounds × dot` wrapped to 32 bits. Also returns whether any
    /// lane wrapped.
    fn closed_form(rounds: u64) -> (i64, bool) {
        let w = weights();
        let mut wrapped = false;
        let sum = (0..CHAINS)
            .flat_map(|c| {
                let a = activations(c);
                (0..CHAIN_BYTES / 4).map(move |l| {
                    (4 * l..4 * l + 4)
                        .map(|i| i64::from(a[i]) * i64::from(w[i]))
                        .sum::<i64>()
                })
            })
            .map(|dot| {
                let exact = dot * rounds as i64;
                let lane = exact as i32;
                wrapped |= i64::from(lane) != exact;
                i64::from(lane)
            })
            .sum();
        (sum, wrapped)
    }

    #[test]
    fn every_isa_returns_the_reference_also_after_lanes_wrap() {
        for rounds in [0, 1, 7, 1000] {
            let (expected, _) = closed_form(rounds);
            for isa in Isa::all_available() {
                assert_eq!(
                    int8_dot_rounds(isa, rounds),
                    expected,
                    "{isa:?}, {rounds} rounds"
                );
            }
        }
        // Enough rounds that lanes wrap (the scalar loop would take long in a debug build).
        let rounds = 400_000;
        let (expected, wrapped) = closed_form(rounds);
        assert!(wrapped);
        for isa in Isa::all_available()
            .into_iter()
            .filter(|&i| i != Isa::Scalar)
        {
            assert_eq!(
                int8_dot_rounds(isa, rounds),
                expected,
                "{isa:?}, {rounds} rounds"
            );
        }
    }

    #[test]
    fn one_round_is_the_plain_dot_products() {
        let w = weights();
        let expected: i64 = (0..CHAINS)
            .map(|c| {
                let a = activations(c);
                (0..CHAIN_BYTES)
                    .map(|i| i64::from(a[i]) * i64::from(w[i]))
                    .sum::<i64>()
            })
            .sum();
        assert_eq!(int8_dot_rounds(Isa::Scalar, 1), expected);
        assert_ne!(expected, 0);
    }
}
