//! Portable k-quant code: ggml's exact dequantizers, ggml's reference quantizers
//! (`quantize_row_q*_K_ref` with `make_qkx2_quants` / `make_qx_quants` / `make_q3_quants`), and
//! the scalar dot products that every SIMD path is tested against.
//!
//! The quantizers are straight ports, operation for operation, so that they produce the same
//! bytes as ggml for the same input (f32 arithmetic without FMA contraction, as ggml-base is
//! compiled); the dot products sum each super-block exactly in i32 and then apply the f32 factors.

// Index loops mirror ggml's C loops, which walk several arrays in lockstep.
#![allow(clippy::needless_range_loop)]

use super::{Q2K_BYTES, Q3K_BYTES, Q4K_BYTES, Q5K_BYTES, Q6K_BYTES, Q8K_BYTES};
use crate::QK_K;
use half::f16;

/// ggml's `GROUP_MAX_EPS`: groups whose largest magnitude is below this quantize to zero.
const GROUP_MAX_EPS: f32 = 1e-15;

#[inline]
pub(super) fn f16_at(b: &[u8], off: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

#[inline]
fn put_f16(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
}

#[inline]
pub(super) fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[inline]
fn i16_at(b: &[u8], off: usize) -> i16 {
    i16::from_le_bytes([b[off], b[off + 1]])
}

/// ggml's `nearest_int`: round to nearest, ties to even, via the 1.5·2²³ magic constant
/// (valid for |x| ≤ 2²² − 1; bit-identical to ggml for every input).
#[inline]
pub(crate) fn nearest_int(fval: f32) -> i32 {
    debug_assert!(fval.abs() <= 4194303.0 || fval.is_nan());
    let val = fval + 12582912.0;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` of a Q4_K/Q5_K block.
#[inline]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The 16 signed 6-bit sub-block scales of a Q3_K block (ggml's `kmask1/kmask2` unpacking).
#[inline]
pub(super) fn q3k_scales(s: &[u8]) -> [i8; 16] {
    let a0 = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let a1 = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let tmp = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let words = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut out = [0i8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        for (ob, b) in o.iter_mut().zip(w.to_le_bytes()) {
            *ob = b as i8 - 32;
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Dequantization (ggml `dequantize_row_q*_K`), exact.
// ---------------------------------------------------------------------------------------------

pub(super) fn dequant_q2k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q2K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 80);
        let min = f16_at(b, 82);
        let scales = &b[0..16];
        for half in 0..2 {
            let q = &b[16 + 32 * half..48 + 32 * half];
            for k in 0..4 {
                let shift = 2 * k;
                for part in 0..2 {
                    let sc = scales[8 * half + 2 * k + part];
                    let dl = d * (sc & 0xF) as f32;
                    let ml = min * (sc >> 4) as f32;
                    let y = &mut y[128 * half + 32 * k + 16 * part..][..16];
                    for (l, yv) in y.iter_mut().enumerate() {
                        *yv = dl * ((q[16 * part + l] >> shift) & 3) as f32 - ml;
                    }
                }
            }
        }
    }
}

pub(super) fn dequant_q3k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q3K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d_all = f16_at(b, 108);
        let hm = &b[0..32];
        let scales = q3k_scales(&b[96..108]);
        for half in 0..2 {
            let q = &b[32 + 32 * half..64 + 32 * half];
            for k in 0..4 {
                let shift = 2 * k;
                let m = 1u8 << (4 * half + k);
                for part in 0..2 {
                    let dl = d_all * scales[8 * half + 2 * k + part] as f32;
                    let y = &mut y[128 * half + 32 * k + 16 * part..][..16];
                    for (l, yv) in y.iter_mut().enumerate() {
                        let i = 16 * part + l;
                        let v = ((q[i] >> shift) & 3) as i32 - if hm[i] & m != 0 { 0 } else { 4 };
                        *yv = dl * v as f32;
                    }
                }
            }
        }
    }
}

pub(super) fn dequant_q4k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q4K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 0);
        let min = f16_at(b, 2);
        let scales = &b[4..16];
        for j in 0..4 {
            let q = &b[16 + 32 * j..48 + 32 * j];
            let (sc1, m1) = scale_min_k4(2 * j, scales);
            let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let (lo, hi) = y[64 * j..64 * j + 64].split_at_mut(32);
            for l in 0..32 {
                lo[l] = d1 * (q[l] & 0xF) as f32 - m1;
                hi[l] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

pub(super) fn dequant_q5k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q5K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 0);
        let min = f16_at(b, 2);
        let scales = &b[4..16];
        let qh = &b[16..48];
        for j in 0..4 {
            let ql = &b[48 + 32 * j..80 + 32 * j];
            let (sc1, m1) = scale_min_k4(2 * j, scales);
            let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
            let (lo, hi) = y[64 * j..64 * j + 64].split_at_mut(32);
            for l in 0..32 {
                let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                lo[l] = d1 * ((ql[l] & 0xF) + h1) as f32 - m1;
                hi[l] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
            }
        }
    }
}

pub(super) fn dequant_q6k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q6K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 208);
        for half in 0..2 {
            let ql = &b[64 * half..64 * half + 64];
            let qh = &b[128 + 32 * half..160 + 32 * half];
            let sc = &b[192 + 8 * half..200 + 8 * half];
            let y = &mut y[128 * half..128 * half + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
            }
        }
    }
}

pub(super) fn dequant_q8k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q8K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f32_at(b, 0);
        for (yv, &q) in y.iter_mut().zip(&b[4..260]) {
            *yv = d * (q as i8) as f32;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reference quantizers (ggml `quantize_row_q*_K_ref`).
// ---------------------------------------------------------------------------------------------

/// ggml `quantize_row_q8_K_ref`, bit for bit: iscale = −127/max where max is the signed value of
/// largest magnitude, `nearest_int` rounding, clamp at 127, block sums of 16. An all-zero block
/// gets d = 0, zero quants and zero sums (ggml leaves its sums unwritten there).
pub(super) fn quantize_q8k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q8K_BYTES)) {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in x {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax == 0.0 {
            y.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        let (head, rest) = y.split_at_mut(4);
        let (qs, bsums) = rest.split_at_mut(QK_K);
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8 as u8;
        }
        for (s, g) in bsums.chunks_exact_mut(2).zip(qs.chunks_exact(16)) {
            let sum: i32 = g.iter().map(|&q| q as i8 as i32).sum();
            s.copy_from_slice(&(sum as i16).to_le_bytes());
        }
        head.copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

/// ggml `make_qkx2_quants`: quantize `x` to `0..=nmax` with a scale and a (non-positive) offset,
/// searching `nstep + 1` candidate scales for the least weighted error. Returns (scale, −min).
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    l_aux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min));
        l_out[i] = l.clamp(0, nmax) as u8;
        let diff = scale * l_out[i] as f32 + min - x[i];
        let diff = if use_mad { diff.abs() } else { diff * diff };
        best_error += weights[i] * diff;
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            l_aux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let dd = sum_w * sum_l2 - sum_l * sum_l;
        if dd > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / dd;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / dd;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * l_aux[i] as f32 + this_min - x[i];
                let diff = if use_mad { diff.abs() } else { diff * diff };
                cur_error += weights[i] * diff;
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&l_aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml `make_qx_quants` with `rmse_type = 1` (weights x²) and no importance weights: symmetric
/// quantization to `-nmax..nmax-1` stored as `l + nmax`, trying 19 scales around `nmax/max`.
fn make_qx_quants_rmse1(nmax: i32, x: &[f32], l_out: &mut [u8]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..x.len()].fill(0);
        return 0.0;
    }
    let mut iscale = -(nmax as f32) / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for (i, &v) in x.iter().enumerate() {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        l_out[i] = (l + nmax) as u8;
        let w = v * v;
        let lf = l as f32;
        sumlx += w * v * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let lf = nearest_int(iscale * v).clamp(-nmax, nmax - 1) as f32;
            let w = v * v;
            sumlx += w * v * lf;
            suml2 += w * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (i, &v) in x.iter().enumerate() {
                let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
                l_out[i] = (nmax + l) as u8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml `make_q3_quants` with `do_rmse = true`: symmetric quantization to `-nmax..nmax-1`
/// (stored as `l + nmax`) refined by up to 5 passes of coordinate descent on the weighted error.
fn make_q3_quants_rmse(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l_out[i] = l as i8;
        let w = x[i] * x[i];
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = x[i] * x[i];
            let li = l_out[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != l_out[i] as i32 {
                    let nl = new_l as f32;
                    slx += w * x[i] * nl;
                    sl2 += w * nl * nl;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for l in &mut l_out[..n] {
        *l += nmax as i8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// Pack 2-bit quants as Q2_K and Q3_K store them: `qs[32h + l]` holds `L[128h + l + 32k]` in
/// bits `2k..2k+2`.
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8]) {
    for h in 0..2 {
        for i in 0..32 {
            let j = 128 * h + i;
            qs[32 * h + i] = l[j] | (l[j + 32] << 2) | (l[j + 64] << 4) | (l[j + 96] << 6);
        }
    }
}

/// ggml `quantize_row_q2_K_ref`.
pub(super) fn quantize_q2k(src: &[f32], dst: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q2K_BYTES)) {
        let mut l = [0u8; QK_K];
        let mut l_aux = [0u8; 16];
        let mut weights = [0f32; 16];
        let mut mins = [0f32; 16];
        let mut scales = [0f32; 16];
        let mut max_scale = 0.0f32;
        let mut max_min = 0.0f32;
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let (s, m) = make_qkx2_quants(
                3,
                xs,
                &weights,
                &mut l[16 * j..16 * j + 16],
                &mut l_aux,
                -0.5,
                0.1,
                15,
                true,
            );
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        y.fill(0);
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..16 {
                y[j] = nearest_int(iscale * scales[j]) as u8;
            }
            put_f16(y, 80, max_scale / Q4SCALE);
        } else {
            put_f16(y, 80, 0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..16 {
                let lm = nearest_int(iscale * mins[j]);
                y[j] |= (lm << 4) as u8;
            }
            put_f16(y, 82, max_min / Q4SCALE);
        } else {
            put_f16(y, 82, 0.0);
        }
        let dq = f16_at(y, 80);
        let dmq = f16_at(y, 82);
        for j in 0..16 {
            let d = dq * (y[j] & 0xF) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = dmq * (y[j] >> 4) as f32;
            for ii in 0..16 {
                let q = nearest_int((x[16 * j + ii] + dm) / d);
                l[16 * j + ii] = q.clamp(0, 3) as u8;
            }
        }
        pack_2bit(&l, &mut y[16..80]);
    }
}

/// ggml `quantize_row_q3_K_ref`.
pub(super) fn quantize_q3k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q3K_BYTES)) {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let mut max_scale = 0.0f32;
        let mut amax = 0.0f32;
        for j in 0..16 {
            scales[j] =
                make_q3_quants_rmse(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }
        y.fill(0);
        {
            let sc = &mut y[96..108];
            if max_scale != 0.0 {
                let iscale = -32.0 / max_scale;
                for (j, &s) in scales.iter().enumerate() {
                    let q = nearest_int(iscale * s) as i8;
                    let q = (q.clamp(-32, 31) + 32) as u8;
                    if j < 8 {
                        sc[j] = q & 0xF;
                    } else {
                        sc[j - 8] |= (q & 0xF) << 4;
                    }
                    sc[j % 4 + 8] |= (q >> 4) << (2 * (j / 4));
                }
                put_f16(y, 108, 1.0 / iscale);
            } else {
                put_f16(y, 108, 0.0);
            }
        }
        let dq = f16_at(y, 108);
        let sc = q3k_scales(&y[96..108]);
        for j in 0..16 {
            let d = dq * sc[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / d);
                l[16 * j + ii] = (q.clamp(-4, 3) + 4) as i8;
            }
        }
        // High bit of quant j goes to bit j/32 of hmask[j % 32]; the low 2 bits stay in L.
        let mut lu = [0u8; QK_K];
        for (j, (&q, u)) in l.iter().zip(lu.iter_mut()).enumerate() {
            let mut q = q as u8;
            if q > 3 {
                y[j % 32] |= 1 << (j / 32);
                q -= 4;
            }
            *u = q;
        }
        pack_2bit(&lu, &mut y[32..96]);
    }
}

/// Pack 6-bit scales and mins of the 8 sub-blocks of a Q4_K/Q5_K block (ggml's layout).
fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8], sc: &mut [u8]) {
    sc[..12].fill(0);
    for j in 0..8 {
        if j < 4 {
            sc[j] = ls[j];
            sc[j + 4] = lm[j];
        } else {
            sc[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            sc[j - 4] |= (ls[j] >> 4) << 6;
            sc[j] |= (lm[j] >> 4) << 6;
        }
    }
}

/// Shared body of ggml `quantize_row_q4_K_ref` / `quantize_row_q5_K_ref`: sub-blocks of 32 with
/// 6-bit scales and mins; returns the quants `0..=nmax` of the block in `l`.
fn quantize_k4_block(
    x: &[f32],
    y: &mut [u8],
    l: &mut [u8; QK_K],
    nmax: i32,
    rmin: f32,
    nstep: i32,
) {
    let mut l_aux = [0u8; 32];
    let mut weights = [0f32; 32];
    let mut mins = [0f32; 8];
    let mut scales = [0f32; 8];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut l[32 * j..32 * j + 32],
            &mut l_aux,
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..8 {
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    pack_scale_min_k4(&ls, &lm, &mut y[4..16]);
    put_f16(y, 0, max_scale / 63.0);
    put_f16(y, 2, max_min / 63.0);
    let dq = f16_at(y, 0);
    let dmq = f16_at(y, 2);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &y[4..16]);
        let d = dq * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmq * m as f32;
        for ii in 0..32 {
            let q = nearest_int((x[32 * j + ii] + dm) / d);
            l[32 * j + ii] = q.clamp(0, nmax) as u8;
        }
    }
}

/// ggml `quantize_row_q4_K_ref`.
pub(super) fn quantize_q4k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q4K_BYTES)) {
        let mut l = [0u8; QK_K];
        quantize_k4_block(x, y, &mut l, 15, -1.0, 20);
        let q = &mut y[16..144];
        for j in 0..4 {
            for i in 0..32 {
                q[32 * j + i] = l[64 * j + i] | (l[64 * j + i + 32] << 4);
            }
        }
    }
}

/// ggml `quantize_row_q5_K_ref`.
pub(super) fn quantize_q5k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q5K_BYTES)) {
        let mut l = [0u8; QK_K];
        quantize_k4_block(x, y, &mut l, 31, -0.5, 15);
        let (qh, ql) = y[16..176].split_at_mut(32);
        qh.fill(0);
        for j in 0..4 {
            let (m1, m2) = (1u8 << (2 * j), 2u8 << (2 * j));
            for i in 0..32 {
                let mut l1 = l[64 * j + i];
                if l1 > 15 {
                    l1 -= 16;
                    qh[i] |= m1;
                }
                let mut l2 = l[64 * j + i + 32];
                if l2 > 15 {
                    l2 -= 16;
                    qh[i] |= m2;
                }
                ql[32 * j + i] = l1 | (l2 << 4);
            }
        }
    }
}

/// ggml `quantize_row_q6_K_ref`.
pub(super) fn quantize_q6k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q6K_BYTES)) {
        let mut l = [0u8; QK_K];
        let mut scales = [0f32; 16];
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for ib in 0..16 {
            let scale = make_qx_quants_rmse1(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..]);
            scales[ib] = scale;
            let abs_scale = scale.abs();
            if abs_scale > max_abs_scale {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }
        y.fill(0);
        if max_abs_scale < GROUP_MAX_EPS {
            continue;
        }
        let iscale = -128.0 / max_scale;
        put_f16(y, 208, 1.0 / iscale);
        for (ib, &s) in scales.iter().enumerate() {
            y[192 + ib] = nearest_int(iscale * s).min(127) as i8 as u8;
        }
        let dq = f16_at(y, 208);
        for j in 0..16 {
            let d = dq * (y[192 + j] as i8) as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
                l[16 * j + ii] = (q + 32) as u8;
            }
        }
        for h in 0..2 {
            for i in 0..32 {
                let j = 128 * h + i;
                let (q1, q2, q3, q4) = (l[j], l[j + 32], l[j + 64], l[j + 96]);
                y[64 * h + i] = (q1 & 0xF) | ((q3 & 0xF) << 4);
                y[64 * h + i + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4);
                y[128 + 32 * h + i] =
                    (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scalar dot products (ggml `ggml_vec_dot_q*_K_q8_K_generic` structure, exact i32 block sums).
// ---------------------------------------------------------------------------------------------

#[inline]
fn q8(a: &[u8; Q8K_BYTES], i: usize) -> i32 {
    a[4 + i] as i8 as i32
}

pub(super) fn dot_q2k(w: &[[u8; Q2K_BYTES]], a: &[[u8; Q8K_BYTES]]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let sc = &x[0..16];
        let mut summs = 0i32;
        for (j, &s) in sc.iter().enumerate() {
            summs += i16_at(y, 260 + 2 * j) as i32 * (s >> 4) as i32;
        }
        let dy = f32_at(y, 0);
        let dall = dy * f16_at(x, 80);
        let dmin = dy * f16_at(x, 82);
        let mut isum = 0i32;
        for half in 0..2 {
            let q2 = &x[16 + 32 * half..48 + 32 * half];
            for k in 0..4 {
                for part in 0..2 {
                    let d = (sc[8 * half + 2 * k + part] & 0xF) as i32;
                    let base = 128 * half + 32 * k + 16 * part;
                    let mut s = 0i32;
                    for l in 0..16 {
                        s += q8(y, base + l) * ((q2[16 * part + l] >> (2 * k)) & 3) as i32;
                    }
                    isum += d * s;
                }
            }
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

pub(super) fn dot_q3k(w: &[[u8; Q3K_BYTES]], a: &[[u8; Q8K_BYTES]]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let hm = &x[0..32];
        let scales = q3k_scales(&x[96..108]);
        let mut isum = 0i32;
        for half in 0..2 {
            let q3 = &x[32 + 32 * half..64 + 32 * half];
            for k in 0..4 {
                let m = 1u8 << (4 * half + k);
                for part in 0..2 {
                    let base = 128 * half + 32 * k + 16 * part;
                    let mut s = 0i32;
                    for l in 0..16 {
                        let i = 16 * part + l;
                        let v =
                            ((q3[i] >> (2 * k)) & 3) as i32 - if hm[i] & m != 0 { 0 } else { 4 };
                        s += q8(y, base + l) * v;
                    }
                    isum += scales[8 * half + 2 * k + part] as i32 * s;
                }
            }
        }
        sumf += f16_at(x, 108) * f32_at(y, 0) * isum as f32;
    }
    sumf
}

/// Sum over a Q4_K/Q5_K block of `mins[j] × (sum of the 32 activation quants of sub-block j)`.
#[inline]
fn k4_min_sum(scales: &[u8], y: &[u8; Q8K_BYTES]) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        let (_, m) = scale_min_k4(j / 2, scales);
        s += i16_at(y, 260 + 2 * j) as i32 * m as i32;
    }
    s
}

pub(super) fn dot_q4k(w: &[[u8; Q4K_BYTES]], a: &[[u8; Q8K_BYTES]]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let scales = &x[4..16];
        let mut isum = 0i32;
        for j in 0..4 {
            let q4 = &x[16 + 32 * j..48 + 32 * j];
            let (sc1, _) = scale_min_k4(2 * j, scales);
            let (sc2, _) = scale_min_k4(2 * j + 1, scales);
            let (mut s1, mut s2) = (0i32, 0i32);
            for l in 0..32 {
                s1 += q8(y, 64 * j + l) * (q4[l] & 0xF) as i32;
                s2 += q8(y, 64 * j + 32 + l) * (q4[l] >> 4) as i32;
            }
            isum += sc1 as i32 * s1 + sc2 as i32 * s2;
        }
        let dy = f32_at(y, 0);
        let d = dy * f16_at(x, 0);
        let dmin = dy * f16_at(x, 2);
        sumf += d * isum as f32 - dmin * k4_min_sum(scales, y) as f32;
    }
    sumf
}

pub(super) fn dot_q5k(w: &[[u8; Q5K_BYTES]], a: &[[u8; Q8K_BYTES]]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let scales = &x[4..16];
        let qh = &x[16..48];
        let mut isum = 0i32;
        for j in 0..4 {
            let ql = &x[48 + 32 * j..80 + 32 * j];
            let (sc1, _) = scale_min_k4(2 * j, scales);
            let (sc2, _) = scale_min_k4(2 * j + 1, scales);
            let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
            let (mut s1, mut s2) = (0i32, 0i32);
            for l in 0..32 {
                let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                s1 += q8(y, 64 * j + l) * ((ql[l] & 0xF) as i32 + h1);
                s2 += q8(y, 64 * j + 32 + l) * ((ql[l] >> 4) as i32 + h2);
            }
            isum += sc1 as i32 * s1 + sc2 as i32 * s2;
        }
        let dy = f32_at(y, 0);
        let d = dy * f16_at(x, 0);
        let dmin = dy * f16_at(x, 2);
        sumf += d * isum as f32 - dmin * k4_min_sum(scales, y) as f32;
    }
    sumf
}

pub(super) fn dot_q6k(w: &[[u8; Q6K_BYTES]], a: &[[u8; Q8K_BYTES]]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let mut isum = 0i32;
        for half in 0..2 {
            let ql = &x[64 * half..64 * half + 64];
            let qh = &x[128 + 32 * half..160 + 32 * half];
            let sc = &x[192 + 8 * half..200 + 8 * half];
            let base = 128 * half;
            // Sums per 16-value sub-block: index 2·quarter + (l ≥ 16).
            let mut s = [0i32; 8];
            for l in 0..32 {
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                let is = l / 16;
                s[is] += q1 * q8(y, base + l);
                s[is + 2] += q2 * q8(y, base + l + 32);
                s[is + 4] += q3 * q8(y, base + l + 64);
                s[is + 6] += q4 * q8(y, base + l + 96);
            }
            for (k, &v) in s.iter().enumerate() {
                isum += (sc[k] as i8) as i32 * v;
            }
        }
        sumf += f16_at(x, 208) * f32_at(y, 0) * isum as f32;
    }
    sumf
}

pub(super) fn dot_q8k(w: &[[u8; Q8K_BYTES]], a: &[[u8; Q8K_BYTES]]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let mut isum = 0i32;
        for i in 0..QK_K {
            isum += q8(x, i) * q8(y, i);
        }
        sumf += f32_at(x, 0) * f32_at(y, 0) * isum as f32;
    }
    sumf
}
