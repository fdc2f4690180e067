//! AVX-512 (F/BW/VL, optionally VNNI) k-quant × Q8_K dot products for Q4_K, Q5_K and Q6_K.
//!
//! Same arithmetic as the AVX2 kernels, on 64 weights per instruction: a Q4_K/Q5_K step packs
//! the low and high nibbles of 32 quant bytes into one 512-bit register so that it lines up with
//! 64 consecutive activation bytes; a Q6_K step builds 64 six-bit weights from 64 `ql` bytes and
//! the 32 `qh` bytes broadcast to both halves (per-half variable shifts + `vpternlogq` select).
//!
//! Without VNNI the products go through `vpmaddubsw` (i16 pairs) and `vpmaddwd` with the
//! broadcast sub-block scales, as in ggml's AVX2 code. With VNNI, `vpdpbusd` sums groups of 4
//! products straight into i32 lanes (|sum| ≤ 4·63·128 < 2¹⁵, so they still fit i16); two such
//! results are packed to i16 with `vpackssdw` and one `vpmaddwd` applies the scales of 4
//! sub-blocks at once, which halves the per-weight multiply and shuffle work.

use std::arch::x86_64::*;

use super::avx2::{
    at, f16x1, f16x2, f32_of, hsum_ps, k4_mins_prod, load16, load32, unpack_k4_scales,
};
use super::{Q4K_BYTES, Q5K_BYTES, Q6K_BYTES, Q8K_BYTES};

#[inline]
#[target_feature(enable = "avx512f")]
fn load64(b: &[u8; 64]) -> __m512i {
    // SAFETY: `b` is 64 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

/// A `vpshufb` control from its 8 i16 lanes per 128-bit lane: `lanes[l][i]` is the byte index
/// (within the same 128-bit lane) whose value fills i16 lane `i`, as a zero-extended byte when
/// `widen` is set or as the i16 starting at that byte otherwise. Evaluated at compile time.
const fn shuffle_ctrl(lanes: [[i16; 8]; 4], widen: bool) -> [i64; 8] {
    let mut q = [0i64; 8];
    let mut l = 0;
    while l < 4 {
        let mut i = 0;
        while i < 8 {
            let b = lanes[l][i] as u16;
            let v = if widen {
                b | 0x8000
            } else {
                b | ((b + 1) << 8)
            };
            q[2 * l + i / 4] |= (v as i64) << (16 * (i % 4));
            i += 1;
        }
        l += 1;
    }
    q
}

#[inline]
#[target_feature(enable = "avx512f")]
fn vec(q: [i64; 8]) -> __m512i {
    _mm512_set_epi64(q[7], q[6], q[5], q[4], q[3], q[2], q[1], q[0])
}

/// `[a ×4, b ×4]` as the 8 i16 lanes of one 128-bit lane.
const fn pair(a: i16, b: i16) -> [i16; 8] {
    [a, a, a, a, b, b, b, b]
}

/// `[a ×8]`.
const fn all(a: i16) -> [i16; 8] {
    [a; 8]
}

/// The 64 Q4_K/Q5_K weights of step `j` (low nibbles of 32 quant bytes, then high nibbles),
/// lined up with activation bytes `64j..64j+64`; Q5_K passes `hb` (its `qh` bytes in both
/// 256-bit halves) for the 5th bit.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
fn k4_weights(x: &[u8], qs_off: usize, j: usize, hb: Option<__m512i>) -> __m512i {
    let q = load32(at(x, qs_off + 32 * j));
    let q = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q), _mm256_srli_epi16::<4>(q));
    let q = _mm512_and_si512(q, _mm512_set1_epi8(0x0F));
    match hb {
        // Bit 2j of qh[l] is bit 4 of weight 64j + l, bit 2j+1 that of weight 64j + 32 + l.
        Some(hb) => {
            let bits = _mm512_inserti64x4::<1>(
                _mm512_set1_epi8((1u8 << (2 * j)) as i8),
                _mm256_set1_epi8((2u8 << (2 * j)) as i8),
            );
            let k = _mm512_test_epi8_mask(hb, bits);
            _mm512_mask_add_epi8(q, k, q, _mm512_set1_epi8(16))
        }
        None => q,
    }
}

macro_rules! k4_kernel {
    ($name:ident, $mode:ident, $features:literal, $bytes:expr, $high_bits:expr) => {
        #[target_feature(enable = $features)]
        pub(super) fn $name(w: &[[u8; $bytes]], a: &[[u8; Q8K_BYTES]]) -> f32 {
            let mut acc = _mm512_setzero_ps();
            let mut acc_m = _mm256_setzero_ps();
            for (x, y) in w.iter().zip(a) {
                let dd = _mm_mul_ps(f16x2(at(x, 0)), _mm_set1_ps(f32_of(y)));
                let s = unpack_k4_scales(load16(at(x, 4)));
                let sc = _mm512_broadcast_i32x4(s);
                let prod = k4_mins_prod(_mm512_castsi512_si256(sc), y);
                let dmin = _mm256_permutevar8x32_ps(
                    _mm256_castps128_ps256(dd),
                    _mm256_set1_epi32(1),
                );
                acc_m = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(prod), acc_m);
                let hb = if $high_bits {
                    Some(_mm512_broadcast_i64x4(load32(at(x, 16))))
                } else {
                    None
                };
                let sumi = k4_kernel!(@quants $mode, x, y, sc, hb, $bytes - 128);
                acc = _mm512_fmadd_ps(_mm512_broadcastss_ps(dd), _mm512_cvtepi32_ps(sumi), acc);
            }
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
            let acc = _mm256_add_ps(_mm512_castps512_ps256(acc), hi);
            hsum_ps(_mm256_add_ps(acc, acc_m))
        }
    };
    // vpmaddubsw + vpmaddwd per 64 weights (sub-blocks 2j, 2j+1 in the low / high 256 bits).
    (@quants plain, $x:ident, $y:ident, $sc:ident, $hb:ident, $qs_off:expr) => {{
        let shuf = [
            vec(const { shuffle_ctrl([all(0), all(0), all(1), all(1)], true) }),
            vec(const { shuffle_ctrl([all(2), all(2), all(3), all(3)], true) }),
            vec(const { shuffle_ctrl([all(4), all(4), all(5), all(5)], true) }),
            vec(const { shuffle_ctrl([all(6), all(6), all(7), all(7)], true) }),
        ];
        let mut sumi = _mm512_setzero_si512();
        for j in 0..4 {
            let q = k4_weights($x, $qs_off, j, $hb);
            let p = _mm512_maddubs_epi16(q, load64(at($y, 4 + 64 * j)));
            sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(_mm512_shuffle_epi8($sc, shuf[j]), p));
        }
        sumi
    }};
    // vpdpbusd per 64 weights into r_j (i32 lanes 0-7: sub-block 2j, 8-15: 2j+1), then
    // packs(r0, r1) holds sub-blocks [0, 2] in 128-bit lanes 0-1 and [1, 3] in lanes 2-3.
    (@quants vnni, $x:ident, $y:ident, $sc:ident, $hb:ident, $qs_off:expr) => {{
        let shuf01 = vec(const { shuffle_ctrl([pair(0, 2), pair(0, 2), pair(1, 3), pair(1, 3)], true) });
        let shuf23 = vec(const { shuffle_ctrl([pair(4, 6), pair(4, 6), pair(5, 7), pair(5, 7)], true) });
        let mut r = [_mm512_setzero_si512(); 4];
        for (j, r) in r.iter_mut().enumerate() {
            let q = k4_weights($x, $qs_off, j, $hb);
            *r = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, load64(at($y, 4 + 64 * j)));
        }
        let p01 = _mm512_packs_epi32(r[0], r[1]);
        let p23 = _mm512_packs_epi32(r[2], r[3]);
        _mm512_dpwssd_epi32(
            _mm512_madd_epi16(p01, _mm512_shuffle_epi8($sc, shuf01)),
            p23,
            _mm512_shuffle_epi8($sc, shuf23),
        )
    }};
}

k4_kernel!(
    dot_q4k,
    plain,
    "avx512f,avx512bw,avx512vl,avx2,fma,f16c",
    Q4K_BYTES,
    false
);
k4_kernel!(
    dot_q4k_vnni,
    vnni,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    Q4K_BYTES,
    false
);
k4_kernel!(
    dot_q5k,
    plain,
    "avx512f,avx512bw,avx512vl,avx2,fma,f16c",
    Q5K_BYTES,
    true
);
k4_kernel!(
    dot_q5k_vnni,
    vnni,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    Q5K_BYTES,
    true
);

/// The 128 six-bit weights of half `h` of a Q6_K block: (weights 128h..128h+64,
/// 128h+64..128h+128), each lined up with 64 consecutive activation bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
fn q6k_weights(x: &[u8], h: usize) -> (__m512i, __m512i) {
    let m0f = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    // Per 256-bit half: weights 0..32 of the quarter need qh bits 0-1 (low half) / 2-3 (high
    // half) at bits 4-5 for the low nibbles, bits 4-5 / 6-7 for the high nibbles.
    let sl = _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(2));
    let sr = _mm512_inserti64x4::<1>(_mm512_set1_epi16(0), _mm256_set1_epi16(2));
    let ql = load64(at(x, 64 * h));
    let qh = _mm512_broadcast_i64x4(load32(at(x, 128 + 32 * h)));
    // select(mask, a, b) = (a & mask) | (b & !mask)  (vpternlog 0xCA).
    let lo = _mm512_ternarylogic_epi64::<0xCA>(
        m0f,
        ql,
        _mm512_and_si512(_mm512_sllv_epi16(qh, sl), m30),
    );
    let hi = _mm512_ternarylogic_epi64::<0xCA>(
        m0f,
        _mm512_srli_epi16::<4>(ql),
        _mm512_and_si512(_mm512_srlv_epi16(qh, sr), m30),
    );
    (lo, hi)
}

macro_rules! q6k_kernel {
    ($name:ident, $mode:ident, $features:literal) => {
        /// Q6_K × Q8_K: unsigned 6-bit weights, −32 offset removed via the block sums.
        #[target_feature(enable = $features)]
        pub(super) fn $name(w: &[[u8; Q6K_BYTES]], a: &[[u8; Q8K_BYTES]]) -> f32 {
            let mut acc = _mm512_setzero_ps();
            for (x, y) in w.iter().zip(a) {
                let d = f16x1(at(x, 208)) * f32_of(y);
                let sc16 = _mm256_cvtepi8_epi16(load16(at(x, 192)));
                let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(load32(at(y, 260)), sc16));
                // i16 scales of each half in every 128-bit lane.
                let scs = [
                    _mm512_broadcast_i32x4(_mm256_castsi256_si128(sc16)),
                    _mm512_broadcast_i32x4(_mm256_extracti128_si256::<1>(sc16)),
                ];
                let sumi = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), offset));
                let sumi = q6k_kernel!(@quants $mode, x, y, scs, sumi);
                acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
            }
            _mm512_reduce_add_ps(acc)
        }
    };
    // 128-bit lane l of the low (high) 64 weights of a half is sub-block l (4 + l).
    (@quants plain, $x:ident, $y:ident, $scs:ident, $sumi:ident) => {{
        let shuf_lo = vec(const { shuffle_ctrl([all(0), all(2), all(4), all(6)], false) });
        let shuf_hi = vec(const { shuffle_ctrl([all(8), all(10), all(12), all(14)], false) });
        let mut sumi = $sumi;
        for (h, &sc) in $scs.iter().enumerate() {
            let (lo, hi) = q6k_weights($x, h);
            let base = 4 + 128 * h;
            let plo = _mm512_maddubs_epi16(lo, load64(at($y, base)));
            let phi = _mm512_maddubs_epi16(hi, load64(at($y, base + 64)));
            sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(_mm512_shuffle_epi8(sc, shuf_lo), plo));
            sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(_mm512_shuffle_epi8(sc, shuf_hi), phi));
        }
        sumi
    }};
    // packs(r_lo, r_hi) holds sub-blocks [l, 4 + l] in 128-bit lane l.
    (@quants vnni, $x:ident, $y:ident, $scs:ident, $sumi:ident) => {{
        let shuf = vec(const { shuffle_ctrl(
            [pair(0, 8), pair(2, 10), pair(4, 12), pair(6, 14)],
            false,
        ) });
        let mut sumi = $sumi;
        for (h, &sc) in $scs.iter().enumerate() {
            let (lo, hi) = q6k_weights($x, h);
            let base = 4 + 128 * h;
            let rlo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, load64(at($y, base)));
            let rhi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, load64(at($y, base + 64)));
            let p = _mm512_packs_epi32(rlo, rhi);
            sumi = _mm512_dpwssd_epi32(sumi, p, _mm512_shuffle_epi8(sc, shuf));
        }
        sumi
    }};
}

q6k_kernel!(dot_q6k, plain, "avx512f,avx512bw,avx512vl,avx2,fma,f16c");
q6k_kernel!(
    dot_q6k_vnni,
    vnni,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
);
