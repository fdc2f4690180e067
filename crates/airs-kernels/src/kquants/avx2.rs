//! AVX2 (+FMA, F16C) k-quant × Q8_K dot products.
//!
//! Structure after ggml's `ggml_vec_dot_q*_K_q8_K` AVX2 kernels: per super-block, unsigned weight
//! quants × signed activation quants with `vpmaddubsw` (pairs into i16, which cannot saturate for
//! these ranges), sub-block scales applied with `vpmaddwd` into 8 i32 lanes, one i32→f32
//! conversion and FMA per super-block; mins (Q2_K/Q4_K/Q5_K) and Q6_K's −32 offset come from the
//! activation block sums. Differences from ggml: the Q4_K/Q5_K 6-bit scales are unpacked with a
//! few vector ops instead of scalar shifts, scale broadcasts zero-extend in the same `vpshufb`,
//! the Q5_K/Q6_K high bits are positioned with one shift + mask each, the Q3_K scales are
//! unpacked in vector registers, and the mins use one `vpmaddwd` on the raw block sums.
//!
//! Q4_K/Q5_K/Q6_K also come in an AVX-VNNI flavour (VEX `vpdpbusd`/`vpdpwssd`, e.g. Intel
//! Alder Lake and later, AMD Zen 5) chosen at run time: sums of 4 products go straight to i32
//! (they fit i16: |sum| ≤ 4·63·128), two such vectors are packed to i16 so that one `vpdpwssd`
//! applies the scales of two sub-blocks; that saves about a quarter of the per-weight work.
//!
//! All functions take whole super-blocks as fixed-size arrays, so every load below stays inside
//! the block it reads (the offsets are compile-time constants checked by the array types).

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

/// Mins term of a Q4_K/Q5_K block: 8 i32 lanes `m_i · (bsum_{2i} + bsum_{2i+1})` (summing to
/// Σ_j m_j · Σ of the 32 activation quants of sub-block j), from the unpacked scales `s`
/// (`[sc0..7, m0..7]`) broadcast to both 128-bit lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn k4_mins_prod(s: __m256i, y: &[u8; Q8K_BYTES]) -> __m256i {
    // i16 lane k takes m_{k/2} = byte 8 + k/2, zero-extended.
    let ctrl = _mm256_setr_epi8(
        8, -128, 8, -128, 9, -128, 9, -128, 10, -128, 10, -128, 11, -128, 11, -128, //
        12, -128, 12, -128, 13, -128, 13, -128, 14, -128, 14, -128, 15, -128, 15, -128,
    );
    _mm256_madd_epi16(load32(at(y, 260)), _mm256_shuffle_epi8(s, ctrl))
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

/// `vpshufb` control filling i16 lanes 0-3 of both 128-bit lanes with byte `a` and lanes 4-7
/// with byte `b`, zero-extended.
#[inline]
#[target_feature(enable = "avx2")]
fn bcast_u8_pair(a: i8, b: i8) -> __m256i {
    let z = -128i8;
    _mm256_setr_epi8(
        a, z, a, z, a, z, a, z, b, z, b, z, b, z, b, z, //
        a, z, a, z, a, z, a, z, b, z, b, z, b, z, b, z,
    )
}

/// `vpshufb` control filling i16 lanes 0-3 of the low 128-bit lane with i16 element `a`, 4-7
/// with `b`, and of the high lane with `c` and `d`.
#[inline]
#[target_feature(enable = "avx2")]
fn bcast_i16_quad(a: i8, b: i8, c: i8, d: i8) -> __m256i {
    let (a0, a1, b0, b1) = (2 * a, 2 * a + 1, 2 * b, 2 * b + 1);
    let (c0, c1, d0, d1) = (2 * c, 2 * c + 1, 2 * d, 2 * d + 1);
    _mm256_setr_epi8(
        a0, a1, a0, a1, a0, a1, a0, a1, b0, b1, b0, b1, b0, b1, b0, b1, //
        c0, c1, c0, c1, c0, c1, c0, c1, d0, d1, d0, d1, d0, d1, d0, d1,
    )
}

/// The low-nibble and high-nibble weights (32 each) of step `j` of a Q4_K/Q5_K block, lined up
/// with activation bytes `64j..64j+32` and `64j+32..64j+64`. For Q5_K, `h` holds the `qh` bytes
/// shifted right by `2j` (bits 0 and 1 are the 5th bits; a 16-bit lane shift only leaks bits
/// into positions the 0x10 mask discards).
#[inline]
#[target_feature(enable = "avx2")]
fn k4_weights(x: &[u8], qs_off: usize, j: usize, h: Option<__m256i>) -> (__m256i, __m256i) {
    let m4 = _mm256_set1_epi8(0x0F);
    let q = load32(at(x, qs_off + 32 * j));
    let lo = _mm256_and_si256(q, m4);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
    match h {
        Some(h) => {
            let m16 = _mm256_set1_epi8(0x10);
            (
                _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<4>(h), m16)),
                _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16::<3>(h), m16)),
            )
        }
        None => (lo, hi),
    }
}

macro_rules! k4_kernel {
    ($(#[$doc:meta])* $name:ident, $mode:ident, $features:literal, $bytes:expr, $high:expr) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        pub(super) fn $name(w: &[[u8; $bytes]], a: &[[u8; Q8K_BYTES]]) -> f32 {
            let mut acc = _mm256_setzero_ps();
            let mut acc_m = _mm256_setzero_ps();
            for (x, y) in w.iter().zip(a) {
                let dd = _mm_mul_ps(f16x2(at(x, 0)), _mm_set1_ps(f32_of(y)));
                let sc = _mm256_broadcastsi128_si256(unpack_k4_scales(load16(at(x, 4))));
                // Mins: Σ_j m_j · (bsum_{2j} + bsum_{2j+1}), subtracted with factor dmin.
                let dmin = _mm256_permutevar8x32_ps(
                    _mm256_castps128_ps256(dd),
                    _mm256_set1_epi32(1),
                );
                acc_m = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(k4_mins_prod(sc, y)), acc_m);
                let mut h = if $high { Some(load32(at(x, 16))) } else { None };
                let mut sumi = _mm256_setzero_si256();
                for j in 0..4 {
                    let (lo, hi) = k4_weights(x, $bytes - 128, j, h);
                    h = h.map(|h| _mm256_srli_epi16::<2>(h));
                    let (ql, qh) = (load32(at(y, 4 + 64 * j)), load32(at(y, 36 + 64 * j)));
                    sumi = k4_kernel!(@step $mode, sumi, sc, j, lo, hi, ql, qh);
                }
                acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(sumi), acc);
            }
            hsum_ps(_mm256_add_ps(acc, acc_m))
        }
    };
    // ggml's structure: vpmaddubsw pairs, vpmaddwd with the broadcast scale of each sub-block.
    (@step plain, $sumi:ident, $sc:ident, $j:ident, $lo:ident, $hi:ident, $ql:ident, $qh:ident) => {{
        let j = $j as i16;
        let pl = _mm256_maddubs_epi16($lo, $ql);
        let ph = _mm256_maddubs_epi16($hi, $qh);
        let pl = _mm256_madd_epi16(_mm256_shuffle_epi8($sc, bcast_u8_as_i16(2 * j)), pl);
        let ph = _mm256_madd_epi16(_mm256_shuffle_epi8($sc, bcast_u8_as_i16(2 * j + 1)), ph);
        _mm256_add_epi32($sumi, _mm256_add_epi32(pl, ph))
    }};
    // AVX-VNNI: vpdpbusd sums of 4 products (fit i16), packed so that each 128-bit lane holds
    // 4 sums of sub-block 2j then 4 of 2j+1, and one vpdpwssd applies both scales.
    (@step vnni, $sumi:ident, $sc:ident, $j:ident, $lo:ident, $hi:ident, $ql:ident, $qh:ident) => {{
        let j = $j as i8;
        let rl = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), $lo, $ql);
        let rh = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), $hi, $qh);
        let p = _mm256_packs_epi32(rl, rh);
        _mm256_dpwssd_avx_epi32($sumi, p, _mm256_shuffle_epi8($sc, bcast_u8_pair(2 * j, 2 * j + 1)))
    }};
}

k4_kernel!(
    /// Q4_K × Q8_K.
    dot_q4k, plain, "avx2,fma,f16c", Q4K_BYTES, false
);
k4_kernel!(
    /// Q4_K × Q8_K with AVX-VNNI.
    dot_q4k_vnni, vnni, "avx2,fma,f16c,avxvnni", Q4K_BYTES, false
);
k4_kernel!(
    /// Q5_K × Q8_K.
    dot_q5k, plain, "avx2,fma,f16c", Q5K_BYTES, true
);
k4_kernel!(
    /// Q5_K × Q8_K with AVX-VNNI.
    dot_q5k_vnni, vnni, "avx2,fma,f16c,avxvnni", Q5K_BYTES, true
);

/// The four 32-weight quarters of half `h` of a Q6_K block, unsigned 0..63; quarter `k` lines
/// up with activation bytes `128h + 32k..+32` and uses scales `8h + 2k` (low 128-bit lane) and
/// `8h + 2k + 1` (high lane).
#[inline]
#[target_feature(enable = "avx2")]
fn q6k_weights(x: &[u8], h: usize) -> [__m256i; 4] {
    let m15 = _mm256_set1_epi8(0x0F);
    let m48 = _mm256_set1_epi8(0x30);
    let ql0 = load32(at(x, 64 * h));
    let ql1 = load32(at(x, 64 * h + 32));
    let qh = load32(at(x, 128 + 32 * h));
    // High bits 2k..2k+2 of qh move to bits 4-5 (16-bit shifts leak only into masked bits).
    [
        _mm256_or_si256(
            _mm256_and_si256(ql0, m15),
            _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m48),
        ),
        _mm256_or_si256(
            _mm256_and_si256(ql1, m15),
            _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m48),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m15),
            _mm256_and_si256(qh, m48),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m15),
            _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m48),
        ),
    ]
}

macro_rules! q6k_kernel {
    ($(#[$doc:meta])* $name:ident, $mode:ident, $features:literal) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        pub(super) fn $name(w: &[[u8; Q6K_BYTES]], a: &[[u8; Q8K_BYTES]]) -> f32 {
            let mut acc = _mm256_setzero_ps();
            for (x, y) in w.iter().zip(a) {
                let d = f16x1(at(x, 208)) * f32_of(y);
                let sc16 = _mm256_cvtepi8_epi16(load16(at(x, 192)));
                let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(load32(at(y, 260)), sc16));
                // i16 scales of each half in both 128-bit lanes.
                let scs = [
                    _mm256_permute2x128_si256::<0x00>(sc16, sc16),
                    _mm256_permute2x128_si256::<0x11>(sc16, sc16),
                ];
                let mut sumi = _mm256_sub_epi32(_mm256_setzero_si256(), offset);
                for (h, &sc) in scs.iter().enumerate() {
                    let q = q6k_weights(x, h);
                    let base = 4 + 128 * h;
                    let q8 = [
                        load32(at(y, base)),
                        load32(at(y, base + 32)),
                        load32(at(y, base + 64)),
                        load32(at(y, base + 96)),
                    ];
                    sumi = q6k_kernel!(@half $mode, sumi, sc, q, q8);
                }
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
            }
            hsum_ps(acc)
        }
    };
    // ggml's structure: vpmaddubsw pairs, vpmaddwd with scales 2k / 2k+1 per 128-bit lane.
    (@half plain, $sumi:ident, $sc:ident, $q:ident, $q8:ident) => {{
        let mut sumi = $sumi;
        for k in 0..4 {
            let p = _mm256_maddubs_epi16($q[k], $q8[k]);
            let s = _mm256_shuffle_epi8($sc, bcast_i16_pair(2 * k as i16, 2 * k as i16 + 1));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s, p));
        }
        sumi
    }};
    // AVX-VNNI: r_k = vpdpbusd sums of 4 (128-bit lane 0: sub-block 2k, lane 1: 2k+1);
    // packs(r0, r1) holds sub-blocks (0, 2) in lane 0 and (1, 3) in lane 1.
    (@half vnni, $sumi:ident, $sc:ident, $q:ident, $q8:ident) => {{
        let z = _mm256_setzero_si256();
        let r0 = _mm256_dpbusd_avx_epi32(z, $q[0], $q8[0]);
        let r1 = _mm256_dpbusd_avx_epi32(z, $q[1], $q8[1]);
        let r2 = _mm256_dpbusd_avx_epi32(z, $q[2], $q8[2]);
        let r3 = _mm256_dpbusd_avx_epi32(z, $q[3], $q8[3]);
        let p01 = _mm256_packs_epi32(r0, r1);
        let p23 = _mm256_packs_epi32(r2, r3);
        let s01 = _mm256_shuffle_epi8($sc, bcast_i16_quad(0, 2, 1, 3));
        let s23 = _mm256_shuffle_epi8($sc, bcast_i16_quad(4, 6, 5, 7));
        _mm256_dpwssd_avx_epi32(_mm256_dpwssd_avx_epi32($sumi, p01, s01), p23, s23)
    }};
}

q6k_kernel!(
    /// Q6_K × Q8_K. Weights are used unsigned (0..63) and the −32 offset is removed once per
    /// block as 32 · Σ scale_k · bsum_k.
    dot_q6k, plain, "avx2,fma,f16c"
);
q6k_kernel!(
    /// Q6_K × Q8_K with AVX-VNNI.
    dot_q6k_vnni, vnni, "avx2,fma,f16c,avxvnni"
);

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

/// The 16 signed 6-bit scales of a Q3_K block as i8, from the 16 bytes at block offset 94
/// (scales[12] at bytes 2..14): low 4 bits in bytes 0..8 (two per byte), high 2 bits in 8..12.
#[inline]
#[target_feature(enable = "avx2")]
fn unpack_q3k_scales(v: __m128i) -> __m128i {
    let v = _mm_srli_si128::<2>(v); // u32 lanes a0, a1, a2 = scales[0..4], [4..8], [8..12]
    // Low nibbles: [a0, a1, a0 >> 4, a1 >> 4] & 0x0f0f0f0f.
    let lo = _mm_shuffle_epi32::<0b01_00_01_00>(v);
    let lo = _mm_and_si128(
        _mm_srlv_epi32(lo, _mm_set_epi32(4, 4, 0, 0)),
        _mm_set1_epi8(0x0F),
    );
    // High bits: ((a2 >> 2i) & 0x03030303) << 4 for lane i.
    let hi = _mm_shuffle_epi32::<0b10_10_10_10>(v);
    let hi = _mm_and_si128(
        _mm_srlv_epi32(hi, _mm_set_epi32(6, 4, 2, 0)),
        _mm_set1_epi8(3),
    );
    let hi = _mm_slli_epi32::<4>(hi);
    _mm_sub_epi8(_mm_or_si128(lo, hi), _mm_set1_epi8(32))
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
        let all = _mm256_cvtepi8_epi16(unpack_q3k_scales(load16(at(x, 94))));
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
