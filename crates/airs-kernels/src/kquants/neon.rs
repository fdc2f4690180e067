//! NEON k-quant × Q8_K dot products for Q4_K, Q5_K and Q6_K (aarch64).
//!
//! Structure after ggml's ARM NEON kernels: unsigned weight quants (< 64, so valid as i8) times
//! signed activation quants, 16 at a time, summed into i32 lanes; each sub-block's partial sums
//! are multiplied by its integer scale with one `mla` (ggml reduces each sub-block with `addv`
//! instead), reduced once per super-block and scaled by the f32 factors. Mins and Q6_K's −32
//! offset come from the activation block sums.
//!
//! Every kernel exists twice: with `sdot` (the Armv8.2 dot-product extension, used only when the
//! CPU reports "dotprod"; emitted with inline assembly because the `vdotq_s32` intrinsic is
//! not stable in Rust yet) and with `smull` + pairwise widening adds for plain Armv8.0 NEON.

use std::arch::aarch64::*;
use std::arch::asm;

use super::reference::{f16_at, f32_at};
use super::{Q4K_BYTES, Q5K_BYTES, Q6K_BYTES, Q8K_BYTES};

#[inline]
#[target_feature(enable = "neon")]
fn ld(b: &[u8; 16]) -> uint8x16_t {
    // SAFETY: `b` is 16 readable bytes; `ld1 {v.16b}` has no alignment requirement.
    unsafe { vld1q_u8(b.as_ptr()) }
}

#[inline(always)]
fn at<const N: usize>(b: &[u8], off: usize) -> &[u8; N] {
    b[off..off + N].try_into().unwrap()
}

#[inline]
#[target_feature(enable = "neon")]
fn lds(b: &[u8; 16]) -> int8x16_t {
    vreinterpretq_s8_u8(ld(b))
}

/// acc + Σ a·b over groups of 4 bytes, with `sdot`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn dot_sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: `sdot` reads two vector registers and updates one, touching no memory; this
    // function is only compiled for, and only called on, CPUs with the dotprod extension.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// acc + Σ a·b with plain NEON (lane grouping differs from `sdot`, the total is the same).
#[inline]
#[target_feature(enable = "neon")]
fn dot_widen(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    let p1 = vmull_s8(vget_high_s8(a), vget_high_s8(b));
    vaddq_s32(acc, vaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1)))
}

/// Unpacked Q4_K/Q5_K scales and mins: (`[sc0..sc7]`, `[m0..m7]`).
#[inline]
pub(super) fn k4_scales(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let a0 = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let a1 = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let a2 = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let sc0 = a0 & 0x3f3f3f3f;
    let sc1 = (a2 & 0x0f0f0f0f) | ((a0 >> 2) & 0x30303030);
    let m0 = a1 & 0x3f3f3f3f;
    let m1 = ((a2 >> 4) & 0x0f0f0f0f) | ((a1 >> 2) & 0x30303030);
    let sc = (sc0 as u64 | ((sc1 as u64) << 32)).to_le_bytes();
    let m = (m0 as u64 | ((m1 as u64) << 32)).to_le_bytes();
    (sc, m)
}

/// Σ_j m_j · (bsum_{2j} + bsum_{2j+1}).
#[inline]
#[target_feature(enable = "neon")]
fn k4_min_sum(m: [u8; 8], y: &[u8; Q8K_BYTES]) -> i32 {
    let b0 = vreinterpretq_s16_u8(ld(at(y, 260)));
    let b1 = vreinterpretq_s16_u8(ld(at(y, 276)));
    let q8sums = vpaddq_s16(b0, b1);
    let mins = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(u64::from_le_bytes(m))));
    let prod = vaddq_s32(
        vmull_s16(vget_low_s16(q8sums), vget_low_s16(mins)),
        vmull_s16(vget_high_s16(q8sums), vget_high_s16(mins)),
    );
    vaddvq_s32(prod)
}

macro_rules! k4_kernel {
    ($name:ident, $dot:ident, $features:literal, $bytes:expr, $high_bits:expr) => {
        #[target_feature(enable = $features)]
        pub(super) fn $name(w: &[[u8; $bytes]], a: &[[u8; Q8K_BYTES]]) -> f32 {
            let m4 = vdupq_n_u8(0x0F);
            let zero = vdupq_n_s32(0);
            let qs_off = $bytes - 128;
            let mut sumf = 0.0f32;
            for (x, y) in w.iter().zip(a) {
                let dy = f32_at(y, 0);
                let d = dy * f16_at(x, 0);
                let dmin = dy * f16_at(x, 2);
                let (sc, m) = k4_scales(&x[4..16]);
                let summs = k4_min_sum(m, y);
                let (mut h0, mut h1) = if $high_bits {
                    (ld(at(x, 16)), ld(at(x, 32)))
                } else {
                    (vdupq_n_u8(0), vdupq_n_u8(0))
                };
                let mut sumv = zero;
                for j in 0..4 {
                    let q0 = ld(at(x, qs_off + 32 * j));
                    let q1 = ld(at(x, qs_off + 32 * j + 16));
                    let (mut l0, mut l1) = (vandq_u8(q0, m4), vandq_u8(q1, m4));
                    let (mut u0, mut u1) = (vshrq_n_u8::<4>(q0), vshrq_n_u8::<4>(q1));
                    if $high_bits {
                        // Bits 0 / 1 of the (shifted) qh bytes are bit 4 of the low / high nibble.
                        let one = vdupq_n_u8(1);
                        let two = vdupq_n_u8(2);
                        l0 = vorrq_u8(l0, vshlq_n_u8::<4>(vandq_u8(h0, one)));
                        l1 = vorrq_u8(l1, vshlq_n_u8::<4>(vandq_u8(h1, one)));
                        u0 = vorrq_u8(u0, vshlq_n_u8::<3>(vandq_u8(h0, two)));
                        u1 = vorrq_u8(u1, vshlq_n_u8::<3>(vandq_u8(h1, two)));
                        h0 = vshrq_n_u8::<2>(h0);
                        h1 = vshrq_n_u8::<2>(h1);
                    }
                    let yb = 4 + 64 * j;
                    let p1 = $dot(
                        $dot(zero, vreinterpretq_s8_u8(l0), lds(at(y, yb))),
                        vreinterpretq_s8_u8(l1),
                        lds(at(y, yb + 16)),
                    );
                    let p2 = $dot(
                        $dot(zero, vreinterpretq_s8_u8(u0), lds(at(y, yb + 32))),
                        vreinterpretq_s8_u8(u1),
                        lds(at(y, yb + 48)),
                    );
                    sumv = vmlaq_n_s32(sumv, p1, sc[2 * j] as i32);
                    sumv = vmlaq_n_s32(sumv, p2, sc[2 * j + 1] as i32);
                }
                sumf += d * vaddvq_s32(sumv) as f32 - dmin * summs as f32;
            }
            sumf
        }
    };
}

k4_kernel!(dot_q4k_sdot, dot_sdot, "neon,dotprod", Q4K_BYTES, false);
k4_kernel!(dot_q4k, dot_widen, "neon", Q4K_BYTES, false);
k4_kernel!(dot_q5k_sdot, dot_sdot, "neon,dotprod", Q5K_BYTES, true);
k4_kernel!(dot_q5k, dot_widen, "neon", Q5K_BYTES, true);

macro_rules! q6k_kernel {
    ($name:ident, $dot:ident, $features:literal) => {
        /// Q6_K × Q8_K: unsigned 6-bit weights, −32 offset removed via the block sums.
        #[target_feature(enable = $features)]
        pub(super) fn $name(w: &[[u8; Q6K_BYTES]], a: &[[u8; Q8K_BYTES]]) -> f32 {
            let m3 = vdupq_n_u8(3);
            let zero = vdupq_n_s32(0);
            let mut sumf = 0.0f32;
            for (x, y) in w.iter().zip(a) {
                let d = f16_at(x, 208) * f32_at(y, 0);
                let sc = vreinterpretq_s8_u8(ld(at(x, 192)));
                let sc_lo = vmovl_s8(vget_low_s8(sc));
                let sc_hi = vmovl_s8(vget_high_s8(sc));
                let b0 = vreinterpretq_s16_u8(ld(at(y, 260)));
                let b1 = vreinterpretq_s16_u8(ld(at(y, 276)));
                let prod = vaddq_s32(
                    vaddq_s32(
                        vmull_s16(vget_low_s16(b0), vget_low_s16(sc_lo)),
                        vmull_s16(vget_high_s16(b0), vget_high_s16(sc_lo)),
                    ),
                    vaddq_s32(
                        vmull_s16(vget_low_s16(b1), vget_low_s16(sc_hi)),
                        vmull_s16(vget_high_s16(b1), vget_high_s16(sc_hi)),
                    ),
                );
                let offset = vaddvq_s32(prod);
                let scb = at::<16>(x, 192);
                let mut sumv = zero;
                for half in 0..2 {
                    let ql = [
                        ld(at(x, 64 * half)),
                        ld(at(x, 64 * half + 16)),
                        ld(at(x, 64 * half + 32)),
                        ld(at(x, 64 * half + 48)),
                    ];
                    let qh = [ld(at(x, 128 + 32 * half)), ld(at(x, 144 + 32 * half))];
                    // Quarter k, part p (16 weights): low bits from ql[2·(k&1) + p] (low nibble
                    // for k < 2, high nibble otherwise), high bits 2k..2k+2 of qh[p].
                    for k in 0..4 {
                        for p in 0..2 {
                            let l = ql[2 * (k & 1) + p];
                            let l = if k < 2 { l } else { vshrq_n_u8::<4>(l) };
                            let h = match k {
                                0 => vandq_u8(qh[p], m3),
                                1 => vandq_u8(vshrq_n_u8::<2>(qh[p]), m3),
                                2 => vandq_u8(vshrq_n_u8::<4>(qh[p]), m3),
                                _ => vshrq_n_u8::<6>(qh[p]),
                            };
                            // (h << 4) | (l & 0x0F): `sli` keeps the low 4 bits of `l`.
                            let q = vsliq_n_u8::<4>(l, h);
                            let s = 8 * half + 2 * k + p;
                            let yb = 4 + 128 * half + 32 * k + 16 * p;
                            let dp = $dot(zero, vreinterpretq_s8_u8(q), lds(at(y, yb)));
                            sumv = vmlaq_n_s32(sumv, dp, scb[s] as i8 as i32);
                        }
                    }
                }
                sumf += d * (vaddvq_s32(sumv) - 32 * offset) as f32;
            }
            sumf
        }
    };
}

q6k_kernel!(dot_q6k_sdot, dot_sdot, "neon,dotprod");
q6k_kernel!(dot_q6k, dot_widen, "neon");
