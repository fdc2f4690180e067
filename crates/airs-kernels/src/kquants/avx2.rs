//! AVX2 (+FMA, F16C) k-quant × Q8_K dot products.
//!
//! Structure after ggml's `ggml_vec_dot_q*_K_q8_K` AVX2 kernels: per super-block, unsigned weight
//! quants × signed activation quants with `vpmaddubsw` (pairs into i16, which cannot saturate for
//! these ranges), sub-block scales applied with `vpmaddwd` into 8 i32 lanes, one i32→f32
//! conversion and FMA per super-block; mins (Q2_K/Q4_K/Q5_K) and Q6_K's −32 offset come from the
//! activation block sums. Differences from ggml: the Q4_K/Q5_K 6-bit scales are unpacked with a
//! few vector ops instead of scalar shifts, scale broadcasts zero-extend in the same `vpshufb`,
//! and the Q5_K/Q6_K high bits are positioned with one shift + mask each.
//!
//! All functions take whole super-blocks as fixed-size arrays, so every load below stays inside
//! the block it reads (the offsets are compile-time constants checked by the array types).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{Q2K_BYTES, Q3K_BYTES, Q4K_BYTES, Q5K_BYTES, Q6K_BYTES, Q8K_BYTES};

/// `N` bytes of `b` starting at `off`, as an array reference (bounds fold away for constant
/// offsets into fixed-size blocks).
#[inline(always)]
pub(super) fn at<const N: usize>(b: &[u8], off: usize) -> &[u8; N] {
    b[off..off + N].try_into().unwrap()
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load32(b: &[u8; 32]) -> __m256i {
    // SAFETY: `b` is 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load16(b: &[u8; 16]) -> __m128i {
    // SAFETY: `b` is 16 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// The two f16 values at the start of `b` (d, dmin) as f32 lanes 0 and 1.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn f16x2(b: &[u8; 4]) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes(*b)))
}

/// One f16 as f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn f16x1(b: &[u8; 2]) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
        u16::from_le_bytes(*b) as i32
    )))
}

#[inline]
pub(super) fn f32_of(b: &[u8; Q8K_BYTES]) -> f32 {
    f32::from_le_bytes(*at::<4>(b, 0))
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    hsum_ps128(s)
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum_ps128(s: __m128) -> f32 {
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Unpack the 12 packed bytes of Q4_K/Q5_K 6-bit scales and mins (the first 12 bytes of `v`)
/// into bytes `[sc0..sc7, m0..m7]` — ggml's `utmp`/`kmask` shuffle, done in vector registers.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn unpack_k4_scales(v: __m128i) -> __m128i {
    // u32 lanes a0 = bytes 0..4, a1 = 4..8, a2 = 8..12.
    // lane 0: a0 & 0x3f3f3f3f                                  (sc0..3)
    // lane 1: (a2 & 0x0f0f0f0f) | ((a0 >> 2) & 0x30303030)     (sc4..7)
    // lane 2: a1 & 0x3f3f3f3f                                  (m0..3)
    // lane 3: ((a2 >> 4) & 0x0f0f0f0f) | ((a1 >> 2) & 0x30303030) (m4..7)
    let p = _mm_shuffle_epi32::<0b10_01_10_00>(v); // [a0, a2, a1, a2]
    let p = _mm_srlv_epi32(p, _mm_set_epi32(4, 0, 0, 0));
    let p = _mm_and_si128(
        p,
        _mm_set_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f),
    );
    let q = _mm_shuffle_epi32::<0b01_01_00_00>(v); // [a0, a0, a1, a1]
    let q = _mm_and_si128(
        _mm_srli_epi32::<2>(q),
        _mm_set_epi32(0x30303030, 0, 0x30303030, 0),
    );
    _mm_or_si128(p, q)
}

/// `vpshufb` control that broadcasts byte `k` of each 128-bit lane zero-extended to 16 bits.
#[inline]
#[target_feature(enable = "avx2")]
fn bcast_u8_as_i16(k: i16) -> __m256i {
    _mm256_set1_epi16(k | (0x80u16 << 8) as i16)
}

/// `vpshufb` control that broadcasts i16 element `lo` into the low 128-bit lane and `hi` into
/// the high lane.
#[inline]
#[target_feature(enable = "avx2")]
fn bcast_i16_pair(lo: i16, hi: i16) -> __m256i {
    let l = _mm_set1_epi16((2 * lo) | ((2 * lo + 1) << 8));
    let h = _mm_set1_epi16((2 * hi) | ((2 * hi + 1) << 8));
    _mm256_set_m128i(h, l)
}

/// Q4_K × Q8_K.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q4k(w: &[[u8; Q4K_BYTES]], a: &[[u8; Q8K_BYTES]]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let shuf = [
        bcast_u8_as_i16(0),
        bcast_u8_as_i16(1),
        bcast_u8_as_i16(2),
        bcast_u8_as_i16(3),
        bcast_u8_as_i16(4),
        bcast_u8_as_i16(5),
        bcast_u8_as_i16(6),
        bcast_u8_as_i16(7),
    ];
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let dd = _mm_mul_ps(f16x2(at(x, 0)), _mm_set1_ps(f32_of(y)));
        let s = unpack_k4_scales(load16(at(x, 4)));

        // Mins: Σ_j m_j · (bsum_{2j} + bsum_{2j+1}), subtracted with factor dmin.
        let mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(s, s));
        let bs = load32(at(y, 260));
        let q8s = _mm_hadd_epi16(
            _mm256_castsi256_si128(bs),
            _mm256_extracti128_si256::<1>(bs),
        );
        let prod = _mm_madd_epi16(mins, q8s);
        acc_m = _mm_fnmadd_ps(_mm_shuffle_ps::<0x55>(dd, dd), _mm_cvtepi32_ps(prod), acc_m);

        let sc = _mm256_broadcastsi128_si256(s);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let q4 = load32(at(x, 16 + 32 * j));
            let lo = _mm256_and_si256(q4, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q4), m4);
            let pl = _mm256_maddubs_epi16(lo, load32(at(y, 4 + 64 * j)));
            let ph = _mm256_maddubs_epi16(hi, load32(at(y, 36 + 64 * j)));
            let pl = _mm256_madd_epi16(_mm256_shuffle_epi8(sc, shuf[2 * j]), pl);
            let ph = _mm256_madd_epi16(_mm256_shuffle_epi8(sc, shuf[2 * j + 1]), ph);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) + hsum_ps128(acc_m)
}

/// Q5_K × Q8_K.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q5k(w: &[[u8; Q5K_BYTES]], a: &[[u8; Q8K_BYTES]]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let m16 = _mm256_set1_epi8(0x10);
    let shuf = [
        bcast_u8_as_i16(0),
        bcast_u8_as_i16(1),
        bcast_u8_as_i16(2),
        bcast_u8_as_i16(3),
        bcast_u8_as_i16(4),
        bcast_u8_as_i16(5),
        bcast_u8_as_i16(6),
        bcast_u8_as_i16(7),
    ];
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let dd = _mm_mul_ps(f16x2(at(x, 0)), _mm_set1_ps(f32_of(y)));
        let s = unpack_k4_scales(load16(at(x, 4)));

        let mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(s, s));
        let bs = load32(at(y, 260));
        let q8s = _mm_hadd_epi16(
            _mm256_castsi256_si128(bs),
            _mm256_extracti128_si256::<1>(bs),
        );
        let prod = _mm_madd_epi16(mins, q8s);
        acc_m = _mm_fnmadd_ps(_mm_shuffle_ps::<0x55>(dd, dd), _mm_cvtepi32_ps(prod), acc_m);

        let sc = _mm256_broadcastsi128_si256(s);
        // High bits: bit 2j of qh[l] belongs to weight 64j + l, bit 2j+1 to weight 64j + 32 + l.
        // `h` is shifted right by 2 per step, so the wanted bits are always bits 0 and 1; a 16-bit
        // lane shift only leaks bits into positions the 0x10 mask discards.
        let mut h = load32(at(x, 16));
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let q5 = load32(at(x, 48 + 32 * j));
            let lo = _mm256_or_si256(
                _mm256_and_si256(q5, m4),
                _mm256_and_si256(_mm256_slli_epi16::<4>(h), m16),
            );
            let hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(q5), m4),
                _mm256_and_si256(_mm256_slli_epi16::<3>(h), m16),
            );
            h = _mm256_srli_epi16::<2>(h);
            let pl = _mm256_maddubs_epi16(lo, load32(at(y, 4 + 64 * j)));
            let ph = _mm256_maddubs_epi16(hi, load32(at(y, 36 + 64 * j)));
            let pl = _mm256_madd_epi16(_mm256_shuffle_epi8(sc, shuf[2 * j]), pl);
            let ph = _mm256_madd_epi16(_mm256_shuffle_epi8(sc, shuf[2 * j + 1]), ph);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) + hsum_ps128(acc_m)
}

/// Q6_K × Q8_K. Weights are used unsigned (0..63) and the −32 offset is removed once per block
/// as 32 · Σ scale_k · bsum_k.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q6k(w: &[[u8; Q6K_BYTES]], a: &[[u8; Q8K_BYTES]]) -> f32 {
    let m15 = _mm256_set1_epi8(0x0F);
    let m48 = _mm256_set1_epi8(0x30);
    // Quarter k of a half-block (32 weights) uses scales 2k (low lane) and 2k+1 (high lane).
    let shuf = [
        bcast_i16_pair(0, 1),
        bcast_i16_pair(2, 3),
        bcast_i16_pair(4, 5),
        bcast_i16_pair(6, 7),
    ];
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = f16x1(at(x, 208)) * f32_of(y);
        let sc16 = _mm256_cvtepi8_epi16(load16(at(x, 192)));
        let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(load32(at(y, 260)), sc16));
        let scs = [
            _mm256_permute2x128_si256::<0x00>(sc16, sc16),
            _mm256_permute2x128_si256::<0x11>(sc16, sc16),
        ];
        let mut sumi = _mm256_setzero_si256();
        for (half, &sc) in scs.iter().enumerate() {
            let ql0 = load32(at(x, 64 * half));
            let ql1 = load32(at(x, 64 * half + 32));
            let qh = load32(at(x, 128 + 32 * half));
            let w0 = _mm256_or_si256(
                _mm256_and_si256(ql0, m15),
                _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m48),
            );
            let w1 = _mm256_or_si256(
                _mm256_and_si256(ql1, m15),
                _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m48),
            );
            let w2 = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m15),
                _mm256_and_si256(qh, m48),
            );
            let w3 = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m15),
                _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m48),
            );
            let base = 4 + 128 * half;
            let p0 = _mm256_maddubs_epi16(w0, load32(at(y, base)));
            let p1 = _mm256_maddubs_epi16(w1, load32(at(y, base + 32)));
            let p2 = _mm256_maddubs_epi16(w2, load32(at(y, base + 64)));
            let p3 = _mm256_maddubs_epi16(w3, load32(at(y, base + 96)));
            let p0 = _mm256_madd_epi16(_mm256_shuffle_epi8(sc, shuf[0]), p0);
            let p1 = _mm256_madd_epi16(_mm256_shuffle_epi8(sc, shuf[1]), p1);
            let p2 = _mm256_madd_epi16(_mm256_shuffle_epi8(sc, shuf[2]), p2);
            let p3 = _mm256_madd_epi16(_mm256_shuffle_epi8(sc, shuf[3]), p3);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p2, p3));
        }
        let sumi = _mm256_sub_epi32(sumi, offset);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

/// Q2_K × Q8_K (ggml's AVX2 structure).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q2k(w: &[[u8; Q2K_BYTES]], a: &[[u8; Q8K_BYTES]]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm_set1_epi8(0xF);
    let shuf = [
        bcast_i16_pair(0, 1),
        bcast_i16_pair(2, 3),
        bcast_i16_pair(4, 5),
        bcast_i16_pair(6, 7),
    ];
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let dd = _mm_mul_ps(f16x2(at(x, 80)), _mm_set1_ps(f32_of(y)));
        let ms = load16(at(x, 0));
        let scales8 = _mm_and_si128(ms, m4);
        let mins8 = _mm_and_si128(_mm_srli_epi16::<4>(ms), m4);
        let prod = _mm256_madd_epi16(_mm256_cvtepi8_epi16(mins8), load32(at(y, 260)));
        let dmin = _mm256_broadcastss_ps(_mm_shuffle_ps::<0x55>(dd, dd));
        acc = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(prod), acc);

        let all = _mm256_cvtepi8_epi16(scales8);
        let scs = [
            _mm256_permute2x128_si256::<0x00>(all, all),
            _mm256_permute2x128_si256::<0x11>(all, all),
        ];
        let mut sumi = _mm256_setzero_si256();
        for (half, &sc) in scs.iter().enumerate() {
            let q2 = load32(at(x, 16 + 32 * half));
            let base = 4 + 128 * half;
            let w0 = _mm256_and_si256(q2, m3);
            let w1 = _mm256_and_si256(_mm256_srli_epi16::<2>(q2), m3);
            let w2 = _mm256_and_si256(_mm256_srli_epi16::<4>(q2), m3);
            let w3 = _mm256_and_si256(_mm256_srli_epi16::<6>(q2), m3);
            let p0 = _mm256_maddubs_epi16(w0, load32(at(y, base)));
            let p1 = _mm256_maddubs_epi16(w1, load32(at(y, base + 32)));
            let p2 = _mm256_maddubs_epi16(w2, load32(at(y, base + 64)));
            let p3 = _mm256_maddubs_epi16(w3, load32(at(y, base + 96)));
            let p0 = _mm256_madd_epi16(_mm256_shuffle_epi8(sc, shuf[0]), p0);
            let p1 = _mm256_madd_epi16(_mm256_shuffle_epi8(sc, shuf[1]), p1);
            let p2 = _mm256_madd_epi16(_mm256_shuffle_epi8(sc, shuf[2]), p2);
            let p3 = _mm256_madd_epi16(_mm256_shuffle_epi8(sc, shuf[3]), p3);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p2, p3));
        }
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

/// Q3_K × Q8_K (ggml's AVX2 structure: low 2 bits and the "−4 unless high bit" part are
/// multiplied separately, so `vpmaddubsw` sees unsigned weights).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q3k(w: &[[u8; Q3K_BYTES]], a: &[[u8; Q8K_BYTES]]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm256_set1_epi8(4);
    let shuf = [
        bcast_i16_pair(0, 1),
        bcast_i16_pair(2, 3),
        bcast_i16_pair(4, 5),
        bcast_i16_pair(6, 7),
    ];
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = f16x1(at(x, 108)) * f32_of(y);
        let sc8 = super::reference::q3k_scales(&x[96..108]);
        let all = _mm256_cvtepi8_epi16(load16(&sc8.map(|v| v as u8)));
        let scs = [
            _mm256_permute2x128_si256::<0x00>(all, all),
            _mm256_permute2x128_si256::<0x11>(all, all),
        ];
        // `nh` has a bit set where the high bit is clear (weight gets −4); shifted right by one
        // per 32-weight group so the current group's bit is always bit 0 (then moved to bit 2).
        let mut nh = _mm256_xor_si256(load32(at(x, 0)), _mm256_set1_epi8(-1));
        let mut sumi = _mm256_setzero_si256();
        for (half, &sc) in scs.iter().enumerate() {
            let q3 = load32(at(x, 32 + 32 * half));
            let base = 4 + 128 * half;
            let mut ps = [_mm256_setzero_si256(); 4];
            for (k, p) in ps.iter_mut().enumerate() {
                let lo =
                    _mm256_and_si256(_mm256_srlv_epi64(q3, _mm256_set1_epi64x(2 * k as i64)), m3);
                let hi = _mm256_and_si256(_mm256_slli_epi16::<2>(nh), m4);
                nh = _mm256_srli_epi16::<1>(nh);
                let q8 = load32(at(y, base + 32 * k));
                let pk =
                    _mm256_sub_epi16(_mm256_maddubs_epi16(lo, q8), _mm256_maddubs_epi16(hi, q8));
                *p = _mm256_madd_epi16(_mm256_shuffle_epi8(sc, shuf[k]), pk);
            }
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(ps[0], ps[1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(ps[2], ps[3]));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}
