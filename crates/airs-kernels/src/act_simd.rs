//! SIMD activation quantizers, bit-identical to the portable ones for finite inputs: Q8_0 as
//! ggml's SIMD `quantize_row_q8_0` rounds (`crate::act`) and Q8_K as ggml's reference
//! `quantize_row_q8_K` (`kquants::reference`).
//!
//! Why: in a 512-token prefill the tiled matmuls got fast enough that quantizing their inputs
//! (a scalar loop, with `round_ties_even` compiled to a `rintf` call on baseline x86-64) took
//! ≈ 12 % of the time. These versions do the same IEEE operations per value — the same
//! multiply by the same scale, round-half-even (`vrndscaleps`, `vroundps` / `vrndnq`), the same scalar
//! scale arithmetic per block — so they produce the same bytes. NaN and infinite activations
//! may quantize differently (the model is already broken then).
//!
//! Kernels: AVX-512 F/BW, AVX2 (without it, on an AVX2 host the `rintf` calls were 6 % of a
//! TinyLlama Q8_0 512-token prefill's profile) and NEON.
//!
//! Cost: O(n), one pass; ≈ 10× faster than the scalar loops.

/// Quantize `x` as Q8_0 blocks into `out` with SIMD if this CPU has it; `false` if not (the
/// caller runs the portable quantizer). Lengths are the caller's (`out` = 34 bytes per 32).
pub(crate) fn quantize_q8_0(x: &[f32], out: &mut [u8]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
    {
        // SAFETY: AVX-512 F/BW were detected just above.
        unsafe { x86::q8_0(x, out) };
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected just above.
        unsafe { avx2::q8_0(x, out) };
        return true;
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: NEON is part of the aarch64 baseline.
        unsafe { neon::q8_0(x, out) };
        return true;
    }
    #[allow(unreachable_code)]
    {
        let _ = (x, out);
        false
    }
}

/// Quantize `x` as Q8_K blocks into `out` with SIMD if this CPU has it; `false` if not.
pub(crate) fn quantize_q8k(x: &[f32], out: &mut [u8]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
    {
        // SAFETY: AVX-512 F/BW were detected just above.
        unsafe { x86::q8k(x, out) };
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected just above.
        unsafe { avx2::q8k(x, out) };
        return true;
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: NEON is part of the aarch64 baseline.
        unsafe { neon::q8k(x, out) };
        return true;
    }
    #[allow(unreachable_code)]
    {
        let _ = (x, out);
        false
    }
}

/// The f16 bits of `d`, as `half` rounds (to nearest even), little-endian.
#[inline]
fn f16_bytes(d: f32) -> [u8; 2] {
    half::f16::from_f32(d).to_bits().to_le_bytes()
}

/// ggml's Q8_K `max`: the value of largest magnitude, the first one on ties, given `amax`.
/// (NEON's; the x86 kernels compare 16 or 8 lanes at a time.)
#[inline]
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn signed_max(x: &[f32], amax: f32) -> f32 {
    x.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    const ROUND: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn load(x: &[f32; 16]) -> __m512 {
        // SAFETY: `x` is 16 readable f32; `loadu` has no alignment requirement.
        unsafe { _mm512_loadu_ps(x.as_ptr()) }
    }

    /// `round_half_even(v · scale)` as i8 lanes (saturating, as Rust's `as i8`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn codes(v: __m512, scale: f32) -> (__m128i, __m512i) {
        let r = _mm512_roundscale_ps::<ROUND>(_mm512_mul_ps(v, _mm512_set1_ps(scale)));
        let i = _mm512_cvtps_epi32(r);
        (_mm512_cvtsepi32_epi8(i), i)
    }

    /// # Safety
    /// AVX-512 F/BW.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn q8_0(x: &[f32], out: &mut [u8]) {
        for (block, o) in x
            .as_chunks::<32>()
            .0
            .iter()
            .zip(out.as_chunks_mut::<34>().0)
        {
            let (h, _) = block.as_chunks::<16>();
            let (v0, v1) = (load(&h[0]), load(&h[1]));
            let abs = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1));
            let amax = _mm512_reduce_max_ps(abs);
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            o[..2].copy_from_slice(&super::f16_bytes(d));
            let (q0, _) = codes(v0, id);
            let (q1, _) = codes(v1, id);
            // SAFETY: bytes 2..34 of the block are 32 writable bytes.
            unsafe {
                _mm_storeu_si128(o[2..].as_mut_ptr().cast(), q0);
                _mm_storeu_si128(o[18..].as_mut_ptr().cast(), q1);
            }
        }
    }

    /// [`super::signed_max`] 16 lanes at a time: the first value whose magnitude is `amax`
    /// (value by value, the scan was up to 256 dependent compares a block).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn signed_max(v: &[[f32; 16]], amax: f32) -> f32 {
        let target = _mm512_set1_ps(amax);
        for chunk in v {
            let hits = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(load(chunk)), target);
            if hits != 0 {
                return chunk[hits.trailing_zeros() as usize];
            }
        }
        0.0
    }

    /// # Safety
    /// AVX-512 F/BW.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn q8k(x: &[f32], out: &mut [u8]) {
        for (block, o) in x
            .as_chunks::<256>()
            .0
            .iter()
            .zip(out.as_chunks_mut::<292>().0)
        {
            let (v, _) = block.as_chunks::<16>();
            let mut abs = _mm512_setzero_ps();
            for v in v {
                abs = _mm512_max_ps(abs, _mm512_abs_ps(load(v)));
            }
            let amax = _mm512_reduce_max_ps(abs);
            if amax == 0.0 {
                o.fill(0);
                continue;
            }
            let iscale = -127.0 / signed_max(v, amax);
            for (k, v) in v.iter().enumerate() {
                let r =
                    _mm512_roundscale_ps::<ROUND>(_mm512_mul_ps(load(v), _mm512_set1_ps(iscale)));
                let i = _mm512_min_epi32(_mm512_cvtps_epi32(r), _mm512_set1_epi32(127));
                // SAFETY: qs bytes 4 + 16k .. 4 + 16k + 16 are writable.
                unsafe {
                    _mm_storeu_si128(
                        o[4 + 16 * k..].as_mut_ptr().cast(),
                        _mm512_cvtsepi32_epi8(i),
                    )
                };
            }
            // The 16 sums of 16 codes (|code| ≤ 127, so the bytes are the codes exactly),
            // from the codes just stored, 64 a register: `vpsadbw` sums 8 codes biased to u8
            // per 64-bit lane, and a lane pair is a sub-block. (With a horizontal add per
            // sub-block, a 4864-value row took 1.19 µs; this way 0.94.)
            let bias = _mm512_set1_epi8(0x80u8 as i8);
            let pairs: [__m512i; 4] = std::array::from_fn(|q| {
                // SAFETY: bytes 4 + 64q .. 4 + 64q + 64 of the block are its codes.
                let codes = unsafe { _mm512_loadu_si512(o[4 + 64 * q..].as_ptr().cast()) };
                let sad = _mm512_sad_epu8(_mm512_xor_si512(codes, bias), _mm512_setzero_si512());
                // Lanes 2m: sub-block 4q + m.
                _mm512_add_epi64(sad, _mm512_bsrli_epi128::<8>(sad))
            });
            let even = _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0);
            let unbias = _mm512_set1_epi64(16 * 128);
            for (half, (a, b)) in [(pairs[0], pairs[1]), (pairs[2], pairs[3])]
                .into_iter()
                .enumerate()
            {
                let sums = _mm512_sub_epi64(_mm512_permutex2var_epi64(a, even, b), unbias);
                // SAFETY: bytes 260 + 16·half .. + 16 are the block's sums 8·half .. 8·half + 8.
                unsafe {
                    _mm_storeu_si128(
                        o[260 + 16 * half..].as_mut_ptr().cast(),
                        _mm512_cvtepi64_epi16(sums),
                    )
                };
            }
            o[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        }
    }
}

/// AVX2 (AMD Zen 2/3, Intel before AVX-512): 8 lanes a register, `vroundps` to nearest even.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    const ROUND: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

    #[inline]
    #[target_feature(enable = "avx2")]
    fn load(x: &[f32; 8]) -> __m256 {
        // SAFETY: `x` is 8 readable f32; `loadu` has no alignment requirement.
        unsafe { _mm256_loadu_ps(x.as_ptr()) }
    }

    /// The lanes' magnitudes (the sign bit cleared).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn abs(v: __m256) -> __m256 {
        _mm256_andnot_ps(_mm256_set1_ps(-0.0), v)
    }

    /// The largest lane (exact in any order for finite lanes).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn max_lane(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
    }

    /// `round_half_even(v · scale)` as i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn codes(v: __m256, scale: f32) -> __m256i {
        _mm256_cvtps_epi32(_mm256_round_ps::<ROUND>(_mm256_mul_ps(
            v,
            _mm256_set1_ps(scale),
        )))
    }

    /// 32 i32 lanes (four registers, in order) as i8, saturating as Rust's `as i8`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn narrow(i: [__m256i; 4]) -> __m256i {
        // The packs interleave the 128-bit lanes: dword j of the result holds source dwords
        // in the order 0, 4, 1, 5, 2, 6, 3, 7.
        let packed = _mm256_packs_epi16(
            _mm256_packs_epi32(i[0], i[1]),
            _mm256_packs_epi32(i[2], i[3]),
        );
        _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    /// The sum of the 8 i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn sum_lanes(i: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256::<1>(i));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }

    /// # Safety
    /// AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn q8_0(x: &[f32], out: &mut [u8]) {
        for (block, o) in x
            .as_chunks::<32>()
            .0
            .iter()
            .zip(out.as_chunks_mut::<34>().0)
        {
            let (v, _) = block.as_chunks::<8>();
            let v = [load(&v[0]), load(&v[1]), load(&v[2]), load(&v[3])];
            let abs = _mm256_max_ps(
                _mm256_max_ps(abs(v[0]), abs(v[1])),
                _mm256_max_ps(abs(v[2]), abs(v[3])),
            );
            let amax = max_lane(abs);
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            o[..2].copy_from_slice(&super::f16_bytes(d));
            let q = narrow([
                codes(v[0], id),
                codes(v[1], id),
                codes(v[2], id),
                codes(v[3], id),
            ]);
            // SAFETY: bytes 2..34 of the block are 32 writable bytes.
            unsafe { _mm256_storeu_si256(o[2..].as_mut_ptr().cast(), q) };
        }
    }

    /// [`super::signed_max`] 8 lanes at a time.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn signed_max(v: &[[f32; 8]], amax: f32) -> f32 {
        let target = _mm256_set1_ps(amax);
        for chunk in v {
            let eq = _mm256_cmp_ps::<_CMP_EQ_OQ>(abs(load(chunk)), target);
            let hits = _mm256_movemask_ps(eq) as u32;
            if hits != 0 {
                return chunk[hits.trailing_zeros() as usize];
            }
        }
        0.0
    }

    /// # Safety
    /// AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn q8k(x: &[f32], out: &mut [u8]) {
        for (block, o) in x
            .as_chunks::<256>()
            .0
            .iter()
            .zip(out.as_chunks_mut::<292>().0)
        {
            let (v, _) = block.as_chunks::<8>();
            let mut abs_max = _mm256_setzero_ps();
            for v in v {
                abs_max = _mm256_max_ps(abs_max, abs(load(v)));
            }
            let amax = max_lane(abs_max);
            if amax == 0.0 {
                o.fill(0);
                continue;
            }
            let iscale = -127.0 / signed_max(v, amax);
            // 32 values (two sums of 16) a pass.
            for (j, v) in v.as_chunks::<4>().0.iter().enumerate() {
                let top = _mm256_set1_epi32(127);
                let i = [0, 1, 2, 3].map(|r| {
                    // A closure inherits its function's features (here AVX2).
                    _mm256_min_epi32(codes(load(&v[r]), iscale), top)
                });
                // SAFETY: qs bytes 4 + 32j .. 4 + 32j + 32 are writable.
                unsafe { _mm256_storeu_si256(o[4 + 32 * j..].as_mut_ptr().cast(), narrow(i)) };
                for half in 0..2 {
                    let sum = sum_lanes(_mm256_add_epi32(i[2 * half], i[2 * half + 1])) as i16;
                    let at = 260 + 2 * (2 * j + half);
                    o[at..at + 2].copy_from_slice(&sum.to_le_bytes());
                }
            }
            o[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    #[inline]
    #[target_feature(enable = "neon")]
    fn load(x: &[f32; 4]) -> float32x4_t {
        // SAFETY: `x` is 4 readable f32.
        unsafe { vld1q_f32(x.as_ptr()) }
    }

    /// 16 values → `round_half_even(v · scale)` as i32 lanes (4 registers).
    #[inline]
    #[target_feature(enable = "neon")]
    fn codes16(x: &[f32; 16], scale: f32) -> [int32x4_t; 4] {
        let (q, _) = x.as_chunks::<4>();
        std::array::from_fn(|k| vcvtq_s32_f32(vrndnq_f32(vmulq_n_f32(load(&q[k]), scale))))
    }

    /// 16 i32 lanes → 16 saturated i8.
    #[inline]
    #[target_feature(enable = "neon")]
    fn narrow(i: [int32x4_t; 4]) -> int8x16_t {
        let lo = vcombine_s16(vqmovn_s32(i[0]), vqmovn_s32(i[1]));
        let hi = vcombine_s16(vqmovn_s32(i[2]), vqmovn_s32(i[3]));
        vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi))
    }

    #[inline]
    #[target_feature(enable = "neon")]
    fn amax(x: &[f32]) -> f32 {
        let mut m = vdupq_n_f32(0.0);
        for q in x.as_chunks::<4>().0 {
            m = vmaxq_f32(m, vabsq_f32(load(q)));
        }
        vmaxvq_f32(m)
    }

    /// # Safety
    /// NEON (aarch64 baseline).
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn q8_0(x: &[f32], out: &mut [u8]) {
        for (block, o) in x
            .as_chunks::<32>()
            .0
            .iter()
            .zip(out.as_chunks_mut::<34>().0)
        {
            let amax = amax(block);
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            o[..2].copy_from_slice(&super::f16_bytes(d));
            for (k, h) in block.as_chunks::<16>().0.iter().enumerate() {
                let q = narrow(codes16(h, id));
                // SAFETY: bytes 2 + 16k .. 18 + 16k of the block are writable.
                unsafe { vst1q_s8(o[2 + 16 * k..].as_mut_ptr().cast(), q) };
            }
        }
    }

    /// # Safety
    /// NEON (aarch64 baseline).
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn q8k(x: &[f32], out: &mut [u8]) {
        for (block, o) in x
            .as_chunks::<256>()
            .0
            .iter()
            .zip(out.as_chunks_mut::<292>().0)
        {
            let amax = amax(block);
            if amax == 0.0 {
                o.fill(0);
                continue;
            }
            let iscale = -127.0 / super::signed_max(block, amax);
            for (k, h) in block.as_chunks::<16>().0.iter().enumerate() {
                let i = codes16(h, iscale).map(|v| vminq_s32(v, vdupq_n_s32(127)));
                // SAFETY: qs bytes 4 + 16k .. 20 + 16k are writable.
                unsafe { vst1q_s8(o[4 + 16 * k..].as_mut_ptr().cast(), narrow(i)) };
                let sum =
                    vaddvq_s32(vaddq_s32(vaddq_s32(i[0], i[1]), vaddq_s32(i[2], i[3]))) as i16;
                o[260 + 2 * k..262 + 2 * k].copy_from_slice(&sum.to_le_bytes());
            }
            o[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{ActType, GgmlType};

    fn rng(seed: &mut u64) -> u64 {
        *seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Rows with outliers, zero blocks, repeated extremes of both signs, exact halves after
    /// scaling, tiny and huge magnitudes.
    fn rows(seed: &mut u64) -> Vec<Vec<f32>> {
        let n = 1024;
        let mut out = Vec::new();
        for flavour in 0..12u64 {
            let x: Vec<f32> = (0..n)
                .map(|i| {
                    let u = (rng(seed) >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                    match flavour % 6 {
                        0 => u,
                        1 if rng(seed).is_multiple_of(50) => u * 3000.0,
                        1 => u * 0.01,
                        2 if i < 300 => 0.0,
                        2 => u,
                        // Magnitude ties between +m and −m, and values landing on .5 steps.
                        3 => [1.0, -1.0, 0.5, -0.25, 63.5 / 127.0][(rng(seed) % 5) as usize],
                        4 => u * 1e-30,
                        _ => u * 1e30,
                    }
                })
                .collect();
            out.push(x);
        }
        out
    }

    #[test]
    fn simd_q8_0_matches_the_portable_quantizer() {
        let mut seed = 3;
        for x in rows(&mut seed) {
            let mut want = vec![0u8; ActType::Q8_0.row_bytes(x.len())];
            crate::act::quantize_q8_0_like_ggml_simd(&x, &mut want);
            let mut got = vec![0xAAu8; want.len()];
            if super::quantize_q8_0(&x, &mut got) {
                assert!(got == want, "Q8_0 activation bytes differ");
            }
        }
    }

    #[test]
    fn simd_q8k_matches_the_reference_quantizer() {
        let mut seed = 4;
        for x in rows(&mut seed) {
            let mut want = vec![0u8; ActType::Q8K.row_bytes(x.len())];
            crate::quantize_row(GgmlType::Q8K, &x, &mut want).unwrap();
            let mut got = vec![0xAAu8; want.len()];
            if super::quantize_q8k(&x, &mut got) {
                assert!(got == want, "Q8_K activation bytes differ");
            }
            // The AVX2 kernel too where this host also has AVX-512 (which the dispatch picks).
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                let mut got = vec![0xAAu8; want.len()];
                // SAFETY: AVX2 was detected just above.
                unsafe { super::avx2::q8k(&x, &mut got) };
                assert!(got == want, "AVX2 Q8_K activation bytes differ");
            }
        }
    }
}
