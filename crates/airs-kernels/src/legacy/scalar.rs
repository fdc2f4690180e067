//! Portable reference code: float conversions, dequantizers, ggml's reference quantizers and
//! the scalar dot products every SIMD path is tested against.

use super::blocks::{
    BLOCK_LEN, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, blocks, blocks_mut,
};

// ---------------------------------------------------------------------------------------------
// Float conversions (ggml-impl.h), bit-exact with ggml's portable code.

/// IEEE half → f32 (exact for every input; ggml's `ggml_compute_fp16_to_fp32`).
#[inline]
pub(crate) const fn f16_to_f32(h: u16) -> f32 {
    let w = (h as u32) << 16;
    let sign = w & 0x8000_0000;
    let two_w = w.wrapping_add(w);
    const EXP_OFFSET: u32 = 0xE0 << 23;
    const EXP_SCALE: f32 = f32::from_bits(0x0780_0000); // 2^-112
    let normalized = f32::from_bits((two_w >> 4) + EXP_OFFSET) * EXP_SCALE;
    const MAGIC_MASK: u32 = 126 << 23;
    let denormalized = f32::from_bits((two_w >> 17) | MAGIC_MASK) - 0.5;
    const DENORMALIZED_CUTOFF: u32 = 1 << 27;
    let magnitude = if two_w < DENORMALIZED_CUTOFF {
        denormalized.to_bits()
    } else {
        normalized.to_bits()
    };
    f32::from_bits(sign | magnitude)
}

/// f16 bits → f32 for all 65536 values (256 KiB), like ggml's `ggml_table_f32_f16`: in the
/// per-block scale product two table loads beat F16C conversions (`vcvtph2ps` is 2 µops plus
/// a GPR → vector move), and a tensor's scales touch only a few KiB of it.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) static F16_TO_F32_TABLE: [f32; 1 << 16] = {
    let mut table = [0f32; 1 << 16];
    let mut bits = 0;
    while bits < table.len() {
        table[bits] = f16_to_f32(bits as u16);
        bits += 1;
    }
    table
};

/// f32 → IEEE half, round to nearest even, overflow to ±inf, NaN → 0x7E00 with the sign
/// (ggml's `ggml_compute_fp32_to_fp16`).
#[inline]
pub(crate) fn f32_to_f16(f: f32) -> u16 {
    const SCALE_TO_INF: f32 = f32::from_bits(0x7780_0000); // 2^112
    const SCALE_TO_ZERO: f32 = f32::from_bits(0x0880_0000); // 2^-110
    let mut base = (f.abs() * SCALE_TO_INF) * SCALE_TO_ZERO;
    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let bias = (shl1_w & 0xFF00_0000).max(0x7100_0000);
    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let exp_bits = (bits >> 13) & 0x0000_7C00;
    let mantissa_bits = bits & 0x0000_0FFF;
    let nonsign = exp_bits + mantissa_bits;
    ((sign >> 16)
        | if shl1_w > 0xFF00_0000 {
            0x7E00
        } else {
            nonsign
        }) as u16
}

/// bfloat16 → f32 (exact).
#[inline]
pub(crate) fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// f32 → bfloat16, round to nearest even, NaN forced quiet (ggml's `ggml_compute_fp32_to_bf16`).
#[inline]
pub(crate) fn f32_to_bf16(f: f32) -> u16 {
    let u = f.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// The f32 value of a little-endian f16 field.
#[inline]
pub(crate) fn f16_field(bytes: [u8; 2]) -> f32 {
    f16_to_f32(u16::from_le_bytes(bytes))
}

/// The 32 five-bit values of a Q5 block (`qs` nibbles plus `qh` bits), unsigned 0..=31.
#[inline]
fn q5_values(qh: [u8; 4], qs: &[u8; 16]) -> [u8; BLOCK_LEN] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0u8; BLOCK_LEN];
    for (j, &byte) in qs.iter().enumerate() {
        let high_lo = (((qh >> j) << 4) & 0x10) as u8;
        let high_hi = ((qh >> (j + 12)) & 0x10) as u8;
        q[j] = (byte & 0x0F) | high_lo;
        q[j + 16] = (byte >> 4) | high_hi;
    }
    q
}

/// The 32 four-bit values of a Q4 block, unsigned 0..=15.
#[inline]
fn q4_values(qs: &[u8; 16]) -> [u8; BLOCK_LEN] {
    let mut q = [0u8; BLOCK_LEN];
    for (j, &byte) in qs.iter().enumerate() {
        q[j] = byte & 0x0F;
        q[j + 16] = byte >> 4;
    }
    q
}

// ---------------------------------------------------------------------------------------------
// Dequantizers (ggml-quants.c `dequantize_row_*`). `dst.len()` values; lib.rs checks lengths.

pub(crate) fn dequant_f32(src: &[u8], dst: &mut [f32]) {
    for (out, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *out = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

pub(crate) fn dequant_f16(src: &[u8], dst: &mut [f32]) {
    for (out, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *out = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

pub(crate) fn dequant_bf16(src: &[u8], dst: &mut [f32]) {
    for (out, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *out = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

pub(crate) fn dequant_q4_0(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / BLOCK_LEN;
    for (b, out) in blocks::<BlockQ4_0>(src, nb)
        .iter()
        .zip(dst.chunks_exact_mut(BLOCK_LEN))
    {
        let d = f16_field(b.d);
        for (o, q) in out.iter_mut().zip(q4_values(&b.qs)) {
            *o = (i32::from(q) - 8) as f32 * d;
        }
    }
}

pub(crate) fn dequant_q4_1(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / BLOCK_LEN;
    for (b, out) in blocks::<BlockQ4_1>(src, nb)
        .iter()
        .zip(dst.chunks_exact_mut(BLOCK_LEN))
    {
        let (d, m) = (f16_field(b.d), f16_field(b.m));
        for (o, q) in out.iter_mut().zip(q4_values(&b.qs)) {
            *o = f32::from(q) * d + m;
        }
    }
}

pub(crate) fn dequant_q5_0(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / BLOCK_LEN;
    for (b, out) in blocks::<BlockQ5_0>(src, nb)
        .iter()
        .zip(dst.chunks_exact_mut(BLOCK_LEN))
    {
        let d = f16_field(b.d);
        for (o, q) in out.iter_mut().zip(q5_values(b.qh, &b.qs)) {
            *o = (i32::from(q) - 16) as f32 * d;
        }
    }
}

pub(crate) fn dequant_q5_1(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / BLOCK_LEN;
    for (b, out) in blocks::<BlockQ5_1>(src, nb)
        .iter()
        .zip(dst.chunks_exact_mut(BLOCK_LEN))
    {
        let (d, m) = (f16_field(b.d), f16_field(b.m));
        for (o, q) in out.iter_mut().zip(q5_values(b.qh, &b.qs)) {
            *o = f32::from(q) * d + m;
        }
    }
}

pub(crate) fn dequant_q8_0(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / BLOCK_LEN;
    for (b, out) in blocks::<BlockQ8_0>(src, nb)
        .iter()
        .zip(dst.chunks_exact_mut(BLOCK_LEN))
    {
        let d = f16_field(b.d);
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = f32::from(q as i8) * d;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reference quantizers (ggml-quants.c `quantize_row_*_ref`), bit-exact with ggml.

pub(crate) fn quantize_f32(src: &[f32], dst: &mut [u8]) {
    for (b, &x) in dst.chunks_exact_mut(4).zip(src) {
        b.copy_from_slice(&x.to_le_bytes());
    }
}

pub(crate) fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    for (b, &x) in dst.chunks_exact_mut(2).zip(src) {
        b.copy_from_slice(&f32_to_f16(x).to_le_bytes());
    }
}

pub(crate) fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    for (b, &x) in dst.chunks_exact_mut(2).zip(src) {
        b.copy_from_slice(&f32_to_bf16(x).to_le_bytes());
    }
}

/// The value of largest magnitude in `x` (the first one on ties), as ggml's symmetric
/// quantizers pick it (`if (amax < fabsf(v))`).
#[inline]
fn signed_absmax(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// `(min, max)` of `x` starting from `(FLT_MAX, -FLT_MAX)`, as ggml's asymmetric quantizers.
#[inline]
fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

#[inline]
fn reciprocal_or_zero(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

/// C's `(int8_t)f` for the in-range values ggml converts (truncation toward zero).
#[inline]
fn trunc_i8(f: f32) -> i8 {
    f as i8
}

pub(crate) fn quantize_q4_0(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / BLOCK_LEN;
    for (x, b) in src
        .chunks_exact(BLOCK_LEN)
        .zip(blocks_mut::<BlockQ4_0>(dst, nb))
    {
        let d = signed_absmax(x) / -8.0;
        let id = reciprocal_or_zero(d);
        b.d = f32_to_f16(d).to_le_bytes();
        for j in 0..16 {
            let xi0 = trunc_i8(x[j] * id + 8.5).min(15) as u8;
            let xi1 = trunc_i8(x[j + 16] * id + 8.5).min(15) as u8;
            b.qs[j] = xi0 | (xi1 << 4);
        }
    }
}

pub(crate) fn quantize_q4_1(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / BLOCK_LEN;
    for (x, b) in src
        .chunks_exact(BLOCK_LEN)
        .zip(blocks_mut::<BlockQ4_1>(dst, nb))
    {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = reciprocal_or_zero(d);
        b.d = f32_to_f16(d).to_le_bytes();
        b.m = f32_to_f16(min).to_le_bytes();
        for j in 0..16 {
            let xi0 = trunc_i8((x[j] - min) * id + 0.5).min(15) as u8;
            let xi1 = trunc_i8((x[j + 16] - min) * id + 0.5).min(15) as u8;
            b.qs[j] = xi0 | (xi1 << 4);
        }
    }
}

pub(crate) fn quantize_q5_0(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / BLOCK_LEN;
    for (x, b) in src
        .chunks_exact(BLOCK_LEN)
        .zip(blocks_mut::<BlockQ5_0>(dst, nb))
    {
        let d = signed_absmax(x) / -16.0;
        let id = reciprocal_or_zero(d);
        b.d = f32_to_f16(d).to_le_bytes();
        let mut qh = 0u32;
        for j in 0..16 {
            let xi0 = trunc_i8(x[j] * id + 16.5).min(31) as u8;
            let xi1 = trunc_i8(x[j + 16] * id + 16.5).min(31) as u8;
            b.qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
            qh |= u32::from((xi0 & 0x10) >> 4) << j;
            qh |= u32::from((xi1 & 0x10) >> 4) << (j + 16);
        }
        b.qh = qh.to_le_bytes();
    }
}

pub(crate) fn quantize_q5_1(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / BLOCK_LEN;
    for (x, b) in src
        .chunks_exact(BLOCK_LEN)
        .zip(blocks_mut::<BlockQ5_1>(dst, nb))
    {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = reciprocal_or_zero(d);
        b.d = f32_to_f16(d).to_le_bytes();
        b.m = f32_to_f16(min).to_le_bytes();
        let mut qh = 0u32;
        for j in 0..16 {
            // ggml: `(uint8_t)(x0 + 0.5f)`, no clamp (the value is at most 31 + rounding).
            let xi0 = ((x[j] - min) * id + 0.5) as u8;
            let xi1 = ((x[j + 16] - min) * id + 0.5) as u8;
            b.qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
            qh |= u32::from((xi0 & 0x10) >> 4) << j;
            qh |= u32::from((xi1 & 0x10) >> 4) << (j + 16);
        }
        b.qh = qh.to_le_bytes();
    }
}

/// ggml's `quantize_row_q8_0_ref`: d = amax / 127, q = roundf(x / d) (half away from zero).
/// Also the activation quantizer for every legacy weight type, so it must match bit for bit.
pub(crate) fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / BLOCK_LEN;
    for (x, b) in src
        .chunks_exact(BLOCK_LEN)
        .zip(blocks_mut::<BlockQ8_0>(dst, nb))
    {
        let mut amax = 0.0f32;
        for &v in x {
            // C's MAX(amax, fabsf(v)) = amax > |v| ? amax : |v|.
            amax = if amax > v.abs() { amax } else { v.abs() };
        }
        let d = amax / 127.0;
        let id = reciprocal_or_zero(d);
        b.d = f32_to_f16(d).to_le_bytes();
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8 as u8;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scalar dot products: the reference for the SIMD paths. Quantized types follow ggml's
// `ggml_vec_dot_*_generic`: an exact i32 dot per block, times the block's scale product,
// summed in f32. Float types accumulate in f64 like ggml's `ggml_float`.

pub(crate) fn dot_f32(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let (w, a) = (&w[..n * 4], &act[..n * 4]);
    let mut sum = 0.0f64;
    for (x, y) in w.chunks_exact(4).zip(a.chunks_exact(4)) {
        let x = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
        let y = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
        sum += f64::from(x * y);
    }
    sum as f32
}

pub(crate) fn dot_f16(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let (w, a) = (&w[..n * 2], &act[..n * 2]);
    let mut sum = 0.0f64;
    for (x, y) in w.chunks_exact(2).zip(a.chunks_exact(2)) {
        sum += f64::from(f16_field([x[0], x[1]]) * f16_field([y[0], y[1]]));
    }
    sum as f32
}

pub(crate) fn dot_bf16(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let (w, a) = (&w[..n * 2], &act[..n * 2]);
    let mut sum = 0.0f64;
    for (x, y) in w.chunks_exact(2).zip(a.chunks_exact(2)) {
        let x = bf16_to_f32(u16::from_le_bytes([x[0], x[1]]));
        let y = bf16_to_f32(u16::from_le_bytes([y[0], y[1]]));
        sum += f64::from(x * y);
    }
    sum as f32
}

/// Σ q_x[j] · q_y[j] over one block, exact in i32.
#[inline]
fn block_dot_i32(qx: impl Iterator<Item = i32>, qy: &[u8; BLOCK_LEN]) -> i32 {
    qx.zip(qy).map(|(x, &y)| x * i32::from(y as i8)).sum()
}

/// Σ q_y[j] over one activation block.
#[inline]
fn block_sum_i32(qy: &[u8; BLOCK_LEN]) -> i32 {
    qy.iter().map(|&y| i32::from(y as i8)).sum()
}

pub(crate) fn dot_q8_0(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let nb = n / BLOCK_LEN;
    let mut sum = 0.0f32;
    for (x, y) in blocks::<BlockQ8_0>(w, nb)
        .iter()
        .zip(blocks::<BlockQ8_0>(act, nb))
    {
        let sumi = block_dot_i32(x.qs.iter().map(|&q| i32::from(q as i8)), &y.qs);
        sum += sumi as f32 * (f16_field(x.d) * f16_field(y.d));
    }
    sum
}

pub(crate) fn dot_q4_0(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let nb = n / BLOCK_LEN;
    let mut sum = 0.0f32;
    for (x, y) in blocks::<BlockQ4_0>(w, nb)
        .iter()
        .zip(blocks::<BlockQ8_0>(act, nb))
    {
        let q = q4_values(&x.qs);
        let sumi = block_dot_i32(q.iter().map(|&q| i32::from(q) - 8), &y.qs);
        sum += sumi as f32 * (f16_field(x.d) * f16_field(y.d));
    }
    sum
}

pub(crate) fn dot_q5_0(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let nb = n / BLOCK_LEN;
    let mut sum = 0.0f32;
    for (x, y) in blocks::<BlockQ5_0>(w, nb)
        .iter()
        .zip(blocks::<BlockQ8_0>(act, nb))
    {
        let q = q5_values(x.qh, &x.qs);
        let sumi = block_dot_i32(q.iter().map(|&q| i32::from(q) - 16), &y.qs);
        sum += sumi as f32 * (f16_field(x.d) * f16_field(y.d));
    }
    sum
}

/// Q4_1/Q5_1 against Q8_0 activations: Σ (q·dx + m)(qy·dy) = dx·dy·Σq·qy + m·(dy·Σqy).
/// ggml pairs these with Q8_1, whose block carries s = dy·Σqy; here it is computed from the
/// Q8_0 block instead (in f32, so slightly more precise than Q8_1's f16 `s`).
pub(crate) fn dot_q4_1(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let nb = n / BLOCK_LEN;
    let mut sum = 0.0f32;
    for (x, y) in blocks::<BlockQ4_1>(w, nb)
        .iter()
        .zip(blocks::<BlockQ8_0>(act, nb))
    {
        let q = q4_values(&x.qs);
        let sumi = block_dot_i32(q.iter().map(|&q| i32::from(q)), &y.qs);
        let dy = f16_field(y.d);
        let min_term = f16_field(x.m) * (dy * block_sum_i32(&y.qs) as f32);
        sum += (f16_field(x.d) * dy) * sumi as f32 + min_term;
    }
    sum
}

pub(crate) fn dot_q5_1(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let nb = n / BLOCK_LEN;
    let mut sum = 0.0f32;
    for (x, y) in blocks::<BlockQ5_1>(w, nb)
        .iter()
        .zip(blocks::<BlockQ8_0>(act, nb))
    {
        let q = q5_values(x.qh, &x.qs);
        let sumi = block_dot_i32(q.iter().map(|&q| i32::from(q)), &y.qs);
        let dy = f16_field(y.d);
        let min_term = f16_field(x.m) * (dy * block_sum_i32(&y.qs) as f32);
        sum += (f16_field(x.d) * dy) * sumi as f32 + min_term;
    }
    sum
}
