//! aarch64 NEON dot products, after ggml-cpu/arch/arm/quants.c.
//!
//! Quant kernels widen each block's weights to two `int8x16_t` halves and take the i32 dot
//! with the Q8_0 activations either with `sdot` (the dot-product extension, when the CPU
//! reports "dotprod") or with widening multiplies (`smull` + pairwise adds); the per-block
//! scale product is applied with an f32 FMA, two blocks in flight on two accumulators.
//! Float kernels convert to f32 lanes and FMA on four accumulators.
//!
//! NEON is part of the aarch64 baseline, so the plain kernels need no runtime check; the
//! `dotprod` module's kernels are `#[target_feature(enable = "dotprod")]` and are only called
//! after runtime detection.

use std::arch::aarch64::*;
use std::arch::asm;

use super::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
use super::scalar::F16_TO_F32_TABLE;

#[inline]
#[target_feature(enable = "neon")]
fn load_u8(bytes: &[u8; 16]) -> uint8x16_t {
    // SAFETY: `bytes` is 16 readable bytes; ld1 of bytes has no alignment requirement.
    unsafe { vld1q_u8(bytes.as_ptr()) }
}

#[inline]
#[target_feature(enable = "neon")]
fn load_i8(bytes: &[u8; 16]) -> int8x16_t {
    vreinterpretq_s8_u8(load_u8(bytes))
}

/// The two 16-byte halves of a 32-byte array.
#[inline]
#[target_feature(enable = "neon")]
fn halves(bytes: &[u8; 32]) -> (&[u8; 16], &[u8; 16]) {
    let (h, _) = bytes.as_chunks::<16>();
    (&h[0], &h[1])
}

/// The f32 value of a little-endian f16 field (via the lookup table: cheaper than moving
/// the bits to a vector register for `fcvtl` and back).
#[inline]
fn f16_value(bits: [u8; 2]) -> f32 {
    F16_TO_F32_TABLE[usize::from(u16::from_le_bytes(bits))]
}

/// f16(a) · f16(b) in f32.
#[inline]
fn scale_product(a: [u8; 2], b: [u8; 2]) -> f32 {
    f16_value(a) * f16_value(b)
}

/// Low and high nibbles of a Q4/Q5 `qs` as bytes 0..=15 (elements 0..16 and 16..32).
#[inline]
#[target_feature(enable = "neon")]
fn nibbles(qs: &[u8; 16]) -> (uint8x16_t, uint8x16_t) {
    let packed = load_u8(qs);
    (vandq_u8(packed, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(packed))
}

/// Bytes 0xFF where bit j of `qh` is set: elements 0..16 and 16..32.
#[inline]
#[target_feature(enable = "neon")]
fn high_bit_masks(qh: [u8; 4]) -> (uint8x16_t, uint8x16_t) {
    const LOW_INDEX: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
    const HIGH_INDEX: [u8; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];
    const BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let qh = vreinterpretq_u8_u32(vdupq_n_u32(u32::from_le_bytes(qh)));
    let bits = load_u8(&BITS);
    let lo = vtstq_u8(vqtbl1q_u8(qh, load_u8(&LOW_INDEX)), bits);
    let hi = vtstq_u8(vqtbl1q_u8(qh, load_u8(&HIGH_INDEX)), bits);
    (lo, hi)
}

/// Σ x·y over 32 signed bytes as 4 × i32, with widening multiplies (baseline NEON).
#[inline]
#[target_feature(enable = "neon")]
fn block_dot_widening(x: (int8x16_t, int8x16_t), y: (int8x16_t, int8x16_t)) -> int32x4_t {
    let lo = vpaddlq_s16(vmull_s8(vget_low_s8(x.0), vget_low_s8(y.0)));
    let lo = vpadalq_s16(lo, vmull_high_s8(x.0, y.0));
    let hi = vpaddlq_s16(vmull_s8(vget_low_s8(x.1), vget_low_s8(y.1)));
    let hi = vpadalq_s16(hi, vmull_high_s8(x.1, y.1));
    vaddq_s32(lo, hi)
}

/// `acc + Σ a·b` per group of 4 signed bytes (`sdot`; `vdotq_s32` is not yet stable Rust).
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: `sdot` reads two vector registers and updates a third; it touches no memory,
    // stack or flags, and this fn is only compiled/run with the dotprod feature.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// Σ x·y over 32 signed bytes as 4 × i32, with `sdot`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn block_dot_sdot(x: (int8x16_t, int8x16_t), y: (int8x16_t, int8x16_t)) -> int32x4_t {
    sdot(sdot(vdupq_n_s32(0), x.0, y.0), x.1, y.1)
}

#[inline]
#[target_feature(enable = "neon")]
fn act_bytes(y: &BlockQ8_0) -> (int8x16_t, int8x16_t) {
    let (lo, hi) = halves(&y.qs);
    (load_i8(lo), load_i8(hi))
}

#[inline]
#[target_feature(enable = "neon")]
fn q8_0_codes(x: &BlockQ8_0) -> (int8x16_t, int8x16_t) {
    act_bytes(x)
}

#[inline]
#[target_feature(enable = "neon")]
fn q4_0_codes(x: &BlockQ4_0) -> (int8x16_t, int8x16_t) {
    let (lo, hi) = nibbles(&x.qs);
    let eight = vdupq_n_s8(8);
    (
        vsubq_s8(vreinterpretq_s8_u8(lo), eight),
        vsubq_s8(vreinterpretq_s8_u8(hi), eight),
    )
}

/// Signed Q5_0 codes: `nibble | (bit << 4)` − 16 = nibble if the bit is set, else nibble | 0xF0.
#[inline]
#[target_feature(enable = "neon")]
fn q5_0_codes(x: &BlockQ5_0) -> (int8x16_t, int8x16_t) {
    let (lo, hi) = nibbles(&x.qs);
    let (bit_lo, bit_hi) = high_bit_masks(x.qh);
    let f0 = vdupq_n_u8(0xF0);
    (
        vreinterpretq_s8_u8(vorrq_u8(lo, vbicq_u8(f0, bit_lo))),
        vreinterpretq_s8_u8(vorrq_u8(hi, vbicq_u8(f0, bit_hi))),
    )
}

#[inline]
#[target_feature(enable = "neon")]
fn q4_1_codes(x: &BlockQ4_1) -> (int8x16_t, int8x16_t) {
    let (lo, hi) = nibbles(&x.qs);
    (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
}

/// Unsigned Q5_1 codes 0..=31 (fit in i8).
#[inline]
#[target_feature(enable = "neon")]
fn q5_1_codes(x: &BlockQ5_1) -> (int8x16_t, int8x16_t) {
    let (lo, hi) = nibbles(&x.qs);
    let (bit_lo, bit_hi) = high_bit_masks(x.qh);
    let b4 = vdupq_n_u8(0x10);
    (
        vreinterpretq_s8_u8(vorrq_u8(lo, vandq_u8(bit_lo, b4))),
        vreinterpretq_s8_u8(vorrq_u8(hi, vandq_u8(bit_hi, b4))),
    )
}

/// Σ over blocks of `scale(x, y) · dot(codes(x), y)` on two accumulators.
macro_rules! symmetric_dot {
    ($w:expr, $a:expr, $codes:ident, $block_dot:ident) => {{
        let (w, a) = ($w, $a);
        let (w_pairs, w_tail) = w.as_chunks::<2>();
        let (a_pairs, a_tail) = a.as_chunks::<2>();
        let mut acc0 = vdupq_n_f32(0.0);
        let mut acc1 = vdupq_n_f32(0.0);
        for (w, a) in w_pairs.iter().zip(a_pairs) {
            let s0 = $block_dot($codes(&w[0]), act_bytes(&a[0]));
            let s1 = $block_dot($codes(&w[1]), act_bytes(&a[1]));
            acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(s0), scale_product(w[0].d, a[0].d));
            acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(s1), scale_product(w[1].d, a[1].d));
        }
        for (w, a) in w_tail.iter().zip(a_tail) {
            let s = $block_dot($codes(w), act_bytes(a));
            acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(s), scale_product(w.d, a.d));
        }
        vaddvq_f32(vaddq_f32(acc0, acc1))
    }};
}

/// Q4_1/Q5_1: Σ dx·dy·Σq·qy + m·dy·Σqy (the min term summed in scalar f32, as ggml).
macro_rules! affine_dot {
    ($w:expr, $a:expr, $codes:ident, $block_dot:ident) => {{
        let (w, a) = ($w, $a);
        let mut acc = vdupq_n_f32(0.0);
        let mut min_terms = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let qy = act_bytes(y);
            let s = $block_dot($codes(x), qy);
            let sum_y = i32::from(vaddlvq_s8(qy.0)) + i32::from(vaddlvq_s8(qy.1));
            let (dx, m, dy) = (f16_value(x.d), f16_value(x.m), f16_value(y.d));
            acc = vfmaq_n_f32(acc, vcvtq_f32_s32(s), dx * dy);
            min_terms += m * (dy * sum_y as f32);
        }
        vaddvq_f32(acc) + min_terms
    }};
}

/// Generates the five quant kernels with one block-dot primitive, optionally under a
/// target feature.
macro_rules! quant_kernels {
    ($(#[$attr:meta])* $block_dot:ident) => {
        $(#[$attr])*
        pub(in crate::legacy) fn dot_q8_0(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
            symmetric_dot!(w, a, q8_0_codes, $block_dot)
        }

        $(#[$attr])*
        pub(in crate::legacy) fn dot_q4_0(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
            symmetric_dot!(w, a, q4_0_codes, $block_dot)
        }

        $(#[$attr])*
        pub(in crate::legacy) fn dot_q5_0(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
            symmetric_dot!(w, a, q5_0_codes, $block_dot)
        }

        $(#[$attr])*
        pub(in crate::legacy) fn dot_q4_1(w: &[BlockQ4_1], a: &[BlockQ8_0]) -> f32 {
            affine_dot!(w, a, q4_1_codes, $block_dot)
        }

        $(#[$attr])*
        pub(in crate::legacy) fn dot_q5_1(w: &[BlockQ5_1], a: &[BlockQ8_0]) -> f32 {
            affine_dot!(w, a, q5_1_codes, $block_dot)
        }
    };
}

/// Baseline NEON kernels (widening multiplies).
pub(super) mod widening {
    use super::*;
    quant_kernels!(
        #[target_feature(enable = "neon")]
        block_dot_widening
    );
}

/// Kernels using `sdot`; callers must have detected the "dotprod" feature.
pub(super) mod dotprod {
    use super::*;
    quant_kernels!(
        #[target_feature(enable = "neon,dotprod")]
        block_dot_sdot
    );
}

// ---------------------------------------------------------------------------------------------
// Float kernels: 16 values per iteration on four accumulators, then a scalar tail.

macro_rules! float_dot_neon {
    ($w:expr, $a:expr, $bytes:literal, $widen:ident, $scalar_tail:path) => {{
        let (w, a) = ($w, $a);
        let (w16, w_tail) = w.as_chunks::<$bytes>();
        let (a16, a_tail) = a.as_chunks::<$bytes>();
        let mut acc = [vdupq_n_f32(0.0); 4];
        for (w, a) in w16.iter().zip(a16) {
            let (x, y) = ($widen(w), $widen(a));
            for k in 0..4 {
                acc[k] = vfmaq_f32(acc[k], x[k], y[k]);
            }
        }
        let acc = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
        let tail_n = w_tail.len() * 16 / $bytes;
        vaddvq_f32(acc) + $scalar_tail(tail_n, w_tail, a_tail)
    }};
}

/// 16 f32 values.
#[inline]
#[target_feature(enable = "neon")]
fn widen_f32(bytes: &[u8; 64]) -> [float32x4_t; 4] {
    let (q, _) = bytes.as_chunks::<16>();
    [0, 1, 2, 3].map(|k| vreinterpretq_f32_u8(load_u8(&q[k])))
}

/// 16 f16 values.
#[inline]
#[target_feature(enable = "neon")]
fn widen_f16(bytes: &[u8; 32]) -> [float32x4_t; 4] {
    let (lo, hi) = halves(bytes);
    let (lo, hi) = (
        vreinterpretq_u16_u8(load_u8(lo)),
        vreinterpretq_u16_u8(load_u8(hi)),
    );
    [
        vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(lo))),
        vcvt_high_f32_f16(vreinterpretq_f16_u16(lo)),
        vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(hi))),
        vcvt_high_f32_f16(vreinterpretq_f16_u16(hi)),
    ]
}

/// 16 bf16 values.
#[inline]
#[target_feature(enable = "neon")]
fn widen_bf16(bytes: &[u8; 32]) -> [float32x4_t; 4] {
    let (lo, hi) = halves(bytes);
    let (lo, hi) = (
        vreinterpretq_u16_u8(load_u8(lo)),
        vreinterpretq_u16_u8(load_u8(hi)),
    );
    [
        vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(lo))),
        vreinterpretq_f32_u32(vshll_high_n_u16::<16>(lo)),
        vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(hi))),
        vreinterpretq_f32_u32(vshll_high_n_u16::<16>(hi)),
    ]
}

#[target_feature(enable = "neon")]
pub(super) fn dot_f32(w: &[u8], a: &[u8]) -> f32 {
    float_dot_neon!(w, a, 64, widen_f32, super::scalar::dot_f32)
}

#[target_feature(enable = "neon")]
pub(super) fn dot_f16(w: &[u8], a: &[u8]) -> f32 {
    float_dot_neon!(w, a, 32, widen_f16, super::scalar::dot_f16)
}

#[target_feature(enable = "neon")]
pub(super) fn dot_bf16(w: &[u8], a: &[u8]) -> f32 {
    float_dot_neon!(w, a, 32, widen_bf16, super::scalar::dot_bf16)
}
