//! x86-64 dot products: AVX2 (+FMA, F16C) for every legacy type, AVX-512 for the float types,
//! and AVX-512 VNNI (two blocks per 512-bit register) for Q8_0, Q4_0 and Q5_0.
//!
//! The AVX2 quant kernels follow ggml-cpu/arch/x86/quants.c: per 32-value block, widen the
//! weights to signed bytes, `maddubs` them against the Q8_0 activations (sign trick: |x| · ±y),
//! sum the i16 pairs to i32, convert to f32 and FMA with the block's scale product. As in
//! ggml's x86 build, block scales go through a 64K-entry f16 → f32 table (two loads and a
//! multiply per block instead of F16C round trips). Unlike ggml, two blocks are in flight on
//! two accumulators, so the loop is not bound by FMA latency.
//!
//! The sign trick (and its AVX-512 form) is exact for every weight code, including -128, as
//! long as activation codes avoid -128 — which the Q8_0 quantizer guarantees (|q| ≤ 127).
//!
//! Every kernel is a safe `#[target_feature]` fn: its callers must run it only on a CPU with
//! those features (the dispatcher in `legacy.rs` checks them). Weight and activation rows are
//! read in place through `&[u8; N]` fields of the block structs with unaligned loads.

use std::arch::x86_64::*;

use super::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
use super::scalar::F16_TO_F32_TABLE;

// ---------------------------------------------------------------------------------------------
// Helpers (inlined into the kernels).

#[inline]
#[target_feature(enable = "avx2")]
fn load_32(bytes: &[u8; 32]) -> __m256i {
    // SAFETY: `bytes` is 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
fn load_16(bytes: &[u8; 16]) -> __m128i {
    // SAFETY: `bytes` is 16 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
}

/// The f32 value of a little-endian f16 field (via the lookup table).
#[inline]
fn f16_value(bits: [u8; 2]) -> f32 {
    F16_TO_F32_TABLE[usize::from(u16::from_le_bytes(bits))]
}

/// The 32 nibbles of a Q4/Q5 `qs` as bytes 0..=15: low nibbles (elements 0..16) in bytes
/// 0..16, high nibbles (elements 16..32) in bytes 16..32.
#[inline]
#[target_feature(enable = "avx2")]
fn nibbles_to_bytes(qs: &[u8; 16]) -> __m256i {
    let packed = load_16(qs);
    let both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Byte `j` = `value` if bit `j` of the little-endian u32 `qh` is clear, else 0.
#[inline]
#[target_feature(enable = "avx2")]
fn clear_bits_to_bytes(qh: [u8; 4], value: i8) -> __m256i {
    // Byte j holds byte j / 8 of qh; keep only bit j % 8 of it.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(i32::from_le_bytes(qh)),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let bit = _mm256_and_si256(spread, _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64));
    let clear = _mm256_cmpeq_epi8(bit, _mm256_setzero_si256());
    _mm256_and_si256(clear, _mm256_set1_epi8(value))
}

/// Σ of adjacent pairs of `u8 · i8` products, then of adjacent i16 pairs: 8 × i32 as f32.
/// Exact while every pair sum fits i16 (|u| ≤ 128, |s| ≤ 127).
#[inline]
#[target_feature(enable = "avx2")]
fn mul_sum_u8_i8_float(u: __m256i, s: __m256i) -> __m256 {
    let pairs = _mm256_maddubs_epi16(u, s);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// Σ of `x · y` over groups of 4 signed bytes as 8 × f32, via |x| · (y with x's sign).
/// Exact unless y holds -128 where x < 0 (the Q8_0 quantizer never emits -128).
#[inline]
#[target_feature(enable = "avx2")]
fn mul_sum_i8_float(x: __m256i, y: __m256i) -> __m256 {
    mul_sum_u8_i8_float(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

#[inline]
#[target_feature(enable = "avx2")]
fn hsum_256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Runs `$block(acc, &w[i], &a[i]) -> acc` over equal-length block slices on two accumulators
/// (even and odd blocks) and returns their horizontal sum.
macro_rules! sum_blocks_2acc {
    ($w:expr, $a:expr, $block:ident) => {{
        let (w, a) = ($w, $a);
        debug_assert_eq!(w.len(), a.len());
        let (w_pairs, w_tail) = w.as_chunks::<2>();
        let (a_pairs, a_tail) = a.as_chunks::<2>();
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        for (w, a) in w_pairs.iter().zip(a_pairs) {
            acc0 = $block(acc0, &w[0], &a[0]);
            acc1 = $block(acc1, &w[1], &a[1]);
        }
        for (w, a) in w_tail.iter().zip(a_tail) {
            acc0 = $block(acc0, w, a);
        }
        hsum_256(_mm256_add_ps(acc0, acc1))
    }};
}

// ---------------------------------------------------------------------------------------------
// AVX2 quant kernels: one block step each.

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_block(acc: __m256, x: &BlockQ8_0, y: &BlockQ8_0) -> __m256 {
    q8_0_block_y(acc, x, load_32(&y.qs), f16_value(y.d))
}

/// [`q8_0_block`] with the activation codes `qy` and scale `dy` already loaded (the same
/// operations, so per-row and multi-row results are identical).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_block_y(acc: __m256, x: &BlockQ8_0, qy: __m256i, dy: f32) -> __m256 {
    let d = _mm256_set1_ps(f16_value(x.d) * dy);
    let q = mul_sum_i8_float(load_32(&x.qs), qy);
    _mm256_fmadd_ps(d, q, acc)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_0_block(acc: __m256, x: &BlockQ4_0, y: &BlockQ8_0) -> __m256 {
    q4_0_block_y(acc, x, load_32(&y.qs), f16_value(y.d))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_0_block_y(acc: __m256, x: &BlockQ4_0, qy: __m256i, dy: f32) -> __m256 {
    let d = _mm256_set1_ps(f16_value(x.d) * dy);
    let qx = _mm256_sub_epi8(nibbles_to_bytes(&x.qs), _mm256_set1_epi8(8));
    let q = mul_sum_i8_float(qx, qy);
    _mm256_fmadd_ps(d, q, acc)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q5_0_block(acc: __m256, x: &BlockQ5_0, y: &BlockQ8_0) -> __m256 {
    q5_0_block_y(acc, x, load_32(&y.qs), f16_value(y.d))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q5_0_block_y(acc: __m256, x: &BlockQ5_0, qy: __m256i, dy: f32) -> __m256 {
    let d = _mm256_set1_ps(f16_value(x.d) * dy);
    // (nibble | bit << 4) - 16 as i8 = nibble if the bit is set, else nibble | 0xF0.
    let high = clear_bits_to_bytes(x.qh, 0xF0u8 as i8);
    let qx = _mm256_or_si256(nibbles_to_bytes(&x.qs), high);
    let q = mul_sum_i8_float(qx, qy);
    _mm256_fmadd_ps(d, q, acc)
}

/// Shared tail of Q4_1/Q5_1: `acc + dx·dy·Σq·qy + m·dy·Σqy` with unsigned `qx`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn affine_block(acc: __m256, qx: __m256i, d: [u8; 2], m: [u8; 2], y: &BlockQ8_0) -> __m256 {
    let qy = load_32(&y.qs);
    let dot = mul_sum_u8_i8_float(qx, qy);
    let sum_y = mul_sum_u8_i8_float(_mm256_set1_epi8(1), qy);
    let dy = f16_value(y.d);
    let d_xy = _mm256_set1_ps(f16_value(d) * dy);
    let m_y = _mm256_set1_ps(f16_value(m) * dy);
    _mm256_add_ps(acc, _mm256_fmadd_ps(dot, d_xy, _mm256_mul_ps(sum_y, m_y)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_1_block(acc: __m256, x: &BlockQ4_1, y: &BlockQ8_0) -> __m256 {
    affine_block(acc, nibbles_to_bytes(&x.qs), x.d, x.m, y)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q5_1_block(acc: __m256, x: &BlockQ5_1, y: &BlockQ8_0) -> __m256 {
    // nibble | bit << 4 = nibble + 16 - (16 where the bit is clear).
    let qx = _mm256_sub_epi8(
        _mm256_or_si256(nibbles_to_bytes(&x.qs), _mm256_set1_epi8(0x10)),
        clear_bits_to_bytes(x.qh, 0x10),
    );
    affine_block(acc, qx, x.d, x.m, y)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q8_0_avx2(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    sum_blocks_2acc!(w, a, q8_0_block)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q4_0_avx2(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    sum_blocks_2acc!(w, a, q4_0_block)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q5_0_avx2(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
    sum_blocks_2acc!(w, a, q5_0_block)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q4_1_avx2(w: &[BlockQ4_1], a: &[BlockQ8_0]) -> f32 {
    sum_blocks_2acc!(w, a, q4_1_block)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_q5_1_avx2(w: &[BlockQ5_1], a: &[BlockQ8_0]) -> f32 {
    sum_blocks_2acc!(w, a, q5_1_block)
}

// ---------------------------------------------------------------------------------------------
// AVX2 multi-row kernels (decode): 4 rows per pass against one activation row, sharing the
// activation loads and scale conversions. Each row goes through exactly the operations of
// its single-row kernel (even/odd blocks on two accumulators, the odd last block on the first,
// one horizontal sum), so results are bit-identical to `dot_*_avx2`.

/// `[dot(w[r], a); 4]` with the single-row `$block` / `$block_y` steps.
macro_rules! sum_blocks_2acc_x4 {
    ($w:expr, $a:expr, $block_y:ident) => {{
        let (w, a) = ($w, $a);
        debug_assert!(w.iter().all(|w| w.len() == a.len()));
        let pairs = a.len() / 2;
        let mut acc0 = [_mm256_setzero_ps(); 4];
        let mut acc1 = [_mm256_setzero_ps(); 4];
        for i in 0..pairs {
            let (y0, y1) = (&a[2 * i], &a[2 * i + 1]);
            let (qy0, dy0) = (load_32(&y0.qs), f16_value(y0.d));
            let (qy1, dy1) = (load_32(&y1.qs), f16_value(y1.d));
            for r in 0..4 {
                acc0[r] = $block_y(acc0[r], &w[r][2 * i], qy0, dy0);
                acc1[r] = $block_y(acc1[r], &w[r][2 * i + 1], qy1, dy1);
            }
        }
        if a.len() % 2 == 1 {
            let y = &a[2 * pairs];
            let (qy, dy) = (load_32(&y.qs), f16_value(y.d));
            for r in 0..4 {
                acc0[r] = $block_y(acc0[r], &w[r][2 * pairs], qy, dy);
            }
        }
        std::array::from_fn(|r| hsum_256(_mm256_add_ps(acc0[r], acc1[r])))
    }};
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot4_q8_0_avx2(w: [&[BlockQ8_0]; 4], a: &[BlockQ8_0]) -> [f32; 4] {
    sum_blocks_2acc_x4!(w, a, q8_0_block_y)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot4_q4_0_avx2(w: [&[BlockQ4_0]; 4], a: &[BlockQ8_0]) -> [f32; 4] {
    sum_blocks_2acc_x4!(w, a, q4_0_block_y)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot4_q5_0_avx2(w: [&[BlockQ5_0]; 4], a: &[BlockQ8_0]) -> [f32; 4] {
    sum_blocks_2acc_x4!(w, a, q5_0_block_y)
}

// ---------------------------------------------------------------------------------------------
// AVX2 float kernels: 4 accumulators × 8 lanes, then 8 lanes at a time, then a scalar tail.

/// `$widen(&[u8; $bytes]) -> __m256` turns 8 values of the row encoding into f32.
macro_rules! float_dot_avx2 {
    ($w:expr, $a:expr, $bytes:literal, $widen:ident, $scalar_tail:path) => {{
        let (w, a) = ($w, $a);
        let (w8, w_tail) = w.as_chunks::<$bytes>();
        let (a8, a_tail) = a.as_chunks::<$bytes>();
        let (w32, w8_tail) = w8.as_chunks::<4>();
        let (a32, a8_tail) = a8.as_chunks::<4>();
        let mut acc = [_mm256_setzero_ps(); 4];
        for (w, a) in w32.iter().zip(a32) {
            for k in 0..4 {
                acc[k] = _mm256_fmadd_ps($widen(&w[k]), $widen(&a[k]), acc[k]);
            }
        }
        for (w, a) in w8_tail.iter().zip(a8_tail) {
            acc[0] = _mm256_fmadd_ps($widen(w), $widen(a), acc[0]);
        }
        let acc = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let tail_n = w_tail.len() * 8 / $bytes;
        hsum_256(acc) + $scalar_tail(tail_n, w_tail, a_tail)
    }};
}

#[inline]
#[target_feature(enable = "avx2")]
fn widen_f32(bytes: &[u8; 32]) -> __m256 {
    _mm256_castsi256_ps(load_32(bytes))
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn widen_f16(bytes: &[u8; 16]) -> __m256 {
    _mm256_cvtph_ps(load_16(bytes))
}

#[inline]
#[target_feature(enable = "avx2")]
fn widen_bf16(bytes: &[u8; 16]) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load_16(bytes)), 16))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_f32_avx2(w: &[u8], a: &[u8]) -> f32 {
    float_dot_avx2!(w, a, 32, widen_f32, super::scalar::dot_f32)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_f16_avx2(w: &[u8], a: &[u8]) -> f32 {
    float_dot_avx2!(w, a, 16, widen_f16, super::scalar::dot_f16)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_bf16_avx2(w: &[u8], a: &[u8]) -> f32 {
    float_dot_avx2!(w, a, 16, widen_bf16, super::scalar::dot_bf16)
}

// ---------------------------------------------------------------------------------------------
// AVX-512 float kernels: 4 accumulators × 16 lanes, then 16 lanes at a time, then one masked
// step for the last < 16 values.

macro_rules! float_dot_avx512 {
    ($w:expr, $a:expr, $bytes:literal, $widen:ident, $widen_masked:ident) => {{
        let (w, a) = ($w, $a);
        let (w16, w_tail) = w.as_chunks::<$bytes>();
        let (a16, a_tail) = a.as_chunks::<$bytes>();
        let (w64, w16_tail) = w16.as_chunks::<4>();
        let (a64, a16_tail) = a16.as_chunks::<4>();
        let mut acc = [_mm512_setzero_ps(); 4];
        for (w, a) in w64.iter().zip(a64) {
            for k in 0..4 {
                acc[k] = _mm512_fmadd_ps($widen(&w[k]), $widen(&a[k]), acc[k]);
            }
        }
        for (w, a) in w16_tail.iter().zip(a16_tail) {
            acc[0] = _mm512_fmadd_ps($widen(w), $widen(a), acc[0]);
        }
        acc[1] = _mm512_fmadd_ps($widen_masked(w_tail), $widen_masked(a_tail), acc[1]);
        let acc = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        _mm512_reduce_add_ps(acc)
    }};
}

#[inline]
#[target_feature(enable = "avx512f")]
fn widen_f32_512(bytes: &[u8; 64]) -> __m512 {
    // SAFETY: `bytes` is 64 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm512_loadu_ps(bytes.as_ptr().cast()) }
}

/// Up to 15 f32 values (`bytes.len() / 4`), zero-filled to 16 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn widen_f32_512_masked(bytes: &[u8]) -> __m512 {
    let count = (bytes.len() / 4).min(16);
    let mask = ((1u32 << count) - 1) as __mmask16;
    // SAFETY: the mask enables only lanes 0..count, whose 4 * count bytes lie in `bytes`;
    // masked-off lanes are not read (no fault), and loadu has no alignment requirement.
    unsafe { _mm512_maskz_loadu_ps(mask, bytes.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn widen_f16_512(bytes: &[u8; 32]) -> __m512 {
    _mm512_cvtph_ps(load_32(bytes))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn load_u16_masked(bytes: &[u8]) -> __m256i {
    let count = (bytes.len() / 2).min(16);
    let mask = ((1u32 << count) - 1) as __mmask16;
    // SAFETY: only lanes 0..count are read, whose 2 * count bytes lie in `bytes`; masked-off
    // lanes do not fault, and loadu has no alignment requirement.
    unsafe { _mm256_maskz_loadu_epi16(mask, bytes.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn widen_f16_512_masked(bytes: &[u8]) -> __m512 {
    _mm512_cvtph_ps(load_u16_masked(bytes))
}

#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn widen_bf16_512(bytes: &[u8; 32]) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(load_32(bytes)), 16))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn widen_bf16_512_masked(bytes: &[u8]) -> __m512 {
    let wide = _mm512_cvtepu16_epi32(load_u16_masked(bytes));
    _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn dot_f32_avx512(w: &[u8], a: &[u8]) -> f32 {
    float_dot_avx512!(w, a, 64, widen_f32_512, widen_f32_512_masked)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn dot_f16_avx512(w: &[u8], a: &[u8]) -> f32 {
    float_dot_avx512!(w, a, 32, widen_f16_512, widen_f16_512_masked)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn dot_bf16_avx512(w: &[u8], a: &[u8]) -> f32 {
    float_dot_avx512!(w, a, 32, widen_bf16_512, widen_bf16_512_masked)
}

// ---------------------------------------------------------------------------------------------
// AVX-512 VNNI quant kernels: two blocks per 512-bit register (block 0 in the low 256 bits),
// `vpdpbusd` for the u8 × i8 dot. Q4_0/Q5_0 use their unsigned codes q directly and subtract
// the offset as `offset · Σy` (a second `vpdpbusd`), which is cheaper than the sign trick.

/// `[lo, hi]` as one 512-bit register.
#[inline]
#[target_feature(enable = "avx512f")]
fn join_256(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// 16 lanes: the scale product of block pair element 0 in lanes 0..8, of element 1 in 8..16.
///
/// Converted with one F16C instruction rather than the table: the pair kernels are bound by
/// load ports, and four table loads would add to the eight loads of the block data.
#[inline]
#[target_feature(enable = "avx512f,avx2,f16c")]
fn pair_scales(xd: [[u8; 2]; 2], yd: [[u8; 2]; 2]) -> __m512 {
    let bits = u64::from(u16::from_le_bytes(xd[0]))
        | (u64::from(u16::from_le_bytes(xd[1])) << 16)
        | (u64::from(u16::from_le_bytes(yd[0])) << 32)
        | (u64::from(u16::from_le_bytes(yd[1])) << 48);
    let d = _mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64)); // [dx0, dx1, dy0, dy1]
    let products = _mm_mul_ps(d, _mm_movehl_ps(d, d)); // [dx0·dy0, dx1·dy1, ..]
    let index = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_permutexvar_ps(index, _mm512_castps128_ps512(products))
}

/// The Q8_0 activation bytes of two blocks.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn load_act_pair(y: &[BlockQ8_0; 2]) -> __m512i {
    join_256(load_32(&y[0].qs), load_32(&y[1].qs))
}

/// Two Q4 `qs` arrays as 64 bytes 0..=15 in element order (block 0 then block 1).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
fn nibble_pair_to_bytes(qs0: &[u8; 16], qs1: &[u8; 16]) -> __m512i {
    // 128-bit lanes [qs0, qs0, qs1, qs1]; shift the 2nd and 4th right by 4 for the high nibbles.
    let packed =
        _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(load_16(qs0)), 0xFF00, load_16(qs1));
    let shifts = _mm512_set_epi64(
        0x0004_0004_0004_0004,
        0x0004_0004_0004_0004,
        0,
        0,
        0x0004_0004_0004_0004,
        0x0004_0004_0004_0004,
        0,
        0,
    );
    _mm512_and_si512(_mm512_srlv_epi16(packed, shifts), _mm512_set1_epi8(0x0F))
}

/// `acc + Σ (q - offset) · y` per 4-byte group, for unsigned codes q.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn dot_offset_codes(q: __m512i, offset: i8, y: __m512i) -> __m512 {
    let zero = _mm512_setzero_si512();
    let dot = _mm512_dpbusd_epi32(zero, q, y);
    let offset_sum = _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(offset), y);
    _mm512_cvtepi32_ps(_mm512_sub_epi32(dot, offset_sum))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q8_0_pair_vnni(acc: __m512, x: &[BlockQ8_0; 2], y: &[BlockQ8_0; 2]) -> __m512 {
    let qx = join_256(load_32(&x[0].qs), load_32(&x[1].qs));
    let qy = load_act_pair(y);
    let zero = _mm512_setzero_si512();
    // |x| · (y negated where x < 0): exact unless y = -128 where x < 0.
    let signed_y = _mm512_mask_sub_epi8(qy, _mm512_movepi8_mask(qx), zero, qy);
    let dot = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(qx), signed_y);
    let scales = pair_scales([x[0].d, x[1].d], [y[0].d, y[1].d]);
    _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scales, acc)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q4_0_pair_vnni(acc: __m512, x: &[BlockQ4_0; 2], y: &[BlockQ8_0; 2]) -> __m512 {
    let q = nibble_pair_to_bytes(&x[0].qs, &x[1].qs);
    let dot = dot_offset_codes(q, 8, load_act_pair(y));
    let scales = pair_scales([x[0].d, x[1].d], [y[0].d, y[1].d]);
    _mm512_fmadd_ps(dot, scales, acc)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q5_0_pair_vnni(acc: __m512, x: &[BlockQ5_0; 2], y: &[BlockQ8_0; 2]) -> __m512 {
    let nibbles = nibble_pair_to_bytes(&x[0].qs, &x[1].qs);
    // Byte j of block b gets its 5th bit from bit j of that block's qh: one 64-bit mask.
    let high_bits =
        u64::from(u32::from_le_bytes(x[0].qh)) | (u64::from(u32::from_le_bytes(x[1].qh)) << 32);
    let q = _mm512_mask_add_epi8(
        nibbles,
        _cvtu64_mask64(high_bits),
        nibbles,
        _mm512_set1_epi8(0x10),
    );
    let dot = dot_offset_codes(q, 16, load_act_pair(y));
    let scales = pair_scales([x[0].d, x[1].d], [y[0].d, y[1].d]);
    _mm512_fmadd_ps(dot, scales, acc)
}

/// Runs a pair step over equal-length block slices on two 512-bit accumulators (4 blocks per
/// iteration); an odd last block goes through the AVX2 single-block step.
macro_rules! sum_block_pairs_vnni {
    ($w:expr, $a:expr, $pair:ident, $single:ident) => {{
        let (w, a) = ($w, $a);
        debug_assert_eq!(w.len(), a.len());
        let (w_pairs, w_tail) = w.as_chunks::<2>();
        let (a_pairs, a_tail) = a.as_chunks::<2>();
        let (w_quads, w_pair_tail) = w_pairs.as_chunks::<2>();
        let (a_quads, a_pair_tail) = a_pairs.as_chunks::<2>();
        let mut acc0 = _mm512_setzero_ps();
        let mut acc1 = _mm512_setzero_ps();
        for (w, a) in w_quads.iter().zip(a_quads) {
            acc0 = $pair(acc0, &w[0], &a[0]);
            acc1 = $pair(acc1, &w[1], &a[1]);
        }
        for (w, a) in w_pair_tail.iter().zip(a_pair_tail) {
            acc0 = $pair(acc0, w, a);
        }
        let mut tail = _mm256_setzero_ps();
        for (w, a) in w_tail.iter().zip(a_tail) {
            tail = $single(tail, w, a);
        }
        let acc = _mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_zextps256_ps512(tail));
        _mm512_reduce_add_ps(acc)
    }};
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn dot_q8_0_avx512vnni(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    sum_block_pairs_vnni!(w, a, q8_0_pair_vnni, q8_0_block)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn dot_q4_0_avx512vnni(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    sum_block_pairs_vnni!(w, a, q4_0_pair_vnni, q4_0_block)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn dot_q5_0_avx512vnni(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
    sum_block_pairs_vnni!(w, a, q5_0_pair_vnni, q5_0_block)
}
