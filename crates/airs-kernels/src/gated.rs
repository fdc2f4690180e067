//! The gated feed-forward's activation, `gate[i] = act(gate[i]) · up[i]`: SwiGLU (SiLU,
//! `x / (1 + e^−x)`) and GeGLU (tanh-approximated GELU), over an `exp` that vectorizes.
//!
//! The `exp` is ggml's `ggml_v_expf` (adapted from Arm's optimized-routines; at most
//! 1.45 + 0.5 ulp) in the form llama.cpp's CPU backend runs on AVX-512, operation for
//! operation: `x = n·ln 2 + b` with `n` rounded through the 1.5·2²³ shift, ln 2 in two parts
//! (each product fused), `1 + ` a degree-5 polynomial in `b` by fused multiply-adds, then
//! scaled by `2ⁿ` with one rounding (`vscalefps`; elsewhere a product with `2ⁿ` built from the
//! shifted sum's low bits, the same bits) and 0 or ∞ past `|n| > 192`. SiLU and GELU around it
//! are ggml's `ggml_v_silu` / `ggml_v_gelu`. (ggml's AVX2 and NEON forms add the 1 last,
//! `k + k·j`, which rounds differently: with that form one position of the Qwen test, where
//! llama.cpp is sure by 0.34, picked another token. This one was measured closer to the llama.cpp
//! reference distributions than libm's `expf`: Qwen mean KLD 0.000796 / 0.000809 with f16 / f32
//! KV against 0.000827 / 0.000840, `airs-runtime` `tests/qwen.rs`.)
//!
//! Why: with libm's `expf`, a call per element, the activation took ~9 % of a 512-token Qwen
//! prefill (perf, BENCHMARKS.md).
//!
//! Every path does the same IEEE operations on each value (fused exactly where ggml fuses,
//! nothing reordered), and a vector with a lane that needs the wide-range scale or passes
//! GELU's cutoff computes that vector with the scalar reference: so the scalar reference,
//! AVX2, AVX-512 and NEON give the same bits (tested over the whole useful range).
//! Cost per 16 values (AVX-512): ~20 instructions and one division.

use airs_gguf::FfnActivation;

use crate::Isa;

/// 1.5 · 2²³ (`0x1.8p23`): adding it rounds to an integer, kept in the low mantissa bits.
const SHIFT: u32 = 0x4b40_0000;
/// log₂ e (`0x1.715476p+0`).
const LOG2_E: u32 = 0x3fb8_aa3b;
/// ln 2 in two parts (`0x1.62e4p-1`, `0x1.7f7d1cp-20`).
const LN2_HI: u32 = 0x3f31_7200;
const LN2_LO: u32 = 0x35bf_be8e;
/// The polynomial's coefficients of b¹ … b⁵ (`0x1.ffffecp-1`, `0x1.fffdb6p-2`,
/// `0x1.555e66p-3`, `0x1.573e2ep-5`, `0x1.0e4020p-7`).
const C1: u32 = 0x3f7f_fff6;
const C2: u32 = 0x3eff_fedb;
const C3: u32 = 0x3e2a_af33;
const C4: u32 = 0x3d2b_9f17;
const C5: u32 = 0x3c07_2010;
/// GELU's `0.044715` and `2·√(2/π)`.
const GELU_A: f32 = 0.044715;
const GELU_B: f32 = 2.0 * 0.797_884_6;
/// Past this GELU argument ggml returns `x` itself.
const GELU_CUTOFF: f32 = 30.0;

const fn f(bits: u32) -> f32 {
    f32::from_bits(bits)
}

/// e^x, the scalar reference of every path (module documentation).
pub fn exp(x: f32) -> f32 {
    let z = x.mul_add(f(LOG2_E), f(SHIFT));
    let n = z - f(SHIFT);
    let b = (-n).mul_add(f(LN2_LO), (-n).mul_add(f(LN2_HI), x));
    let u = b * b;
    let j = f(C5)
        .mul_add(b, f(C4))
        .mul_add(u, f(C3).mul_add(b, f(C2)))
        .mul_add(u, f(C1).mul_add(b, 1.0));
    if n.abs() <= 126.0 || n.is_nan() {
        // 2ⁿ, a normal float, from the low bits of `z` (which hold n).
        return j * f32::from_bits((z.to_bits() << 23).wrapping_add(1.0f32.to_bits()));
    }
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // j · 2ⁿ with one rounding, as `vscalefps`: two normal factors, the first product exact.
    let n = n as i32;
    let (a, b) = (n / 2, n - n / 2);
    let pow2 = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    j * pow2(a) * pow2(b)
}

/// SiLU, `x / (1 + e^−x)` (`−x` as ggml's `0 − x`).
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(0.0 - x))
}

/// GELU, tanh approximation `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, as ggml's SIMD path:
/// `x · e/(e + 1)` with `e = exp(2·√(2/π)·x·(1 + 0.044715·x²))`, and `x` itself once the
/// argument passes 30.
pub fn gelu_tanh(x: f32) -> f32 {
    let arg = x.mul_add(GELU_A * x, 1.0) * (GELU_B * x);
    if arg > GELU_CUTOFF {
        return x;
    }
    let e = exp(arg);
    x * (e / (e + 1.0))
}

/// `gate[i] = act(gate[i]) · up[i]` for every `i` (the slices have equal lengths), with SIMD
/// where `isa` has it; every path gives the scalar reference's bits.
pub fn gated(isa: Isa, act: FfnActivation, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "gate and up rows of equal length");
    let done = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if isa.is_available() => {
            // SAFETY: AVX-512 F (with AVX2 and FMA) is available (checked just above).
            unsafe { x86::gated16(act, gate, up) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 if Isa::Avx2.is_available() => {
            // SAFETY: AVX2 and FMA are available (checked just above).
            unsafe { x86::gated8(act, gate, up) }
        }
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => {
            // SAFETY: NEON is part of the aarch64 baseline.
            unsafe { neon::gated4(act, gate, up) }
        }
        _ => 0,
    };
    scalar(act, &mut gate[done..], &up[done..]);
}

/// The scalar reference over whole slices.
fn scalar(act: FfnActivation, gate: &mut [f32], up: &[f32]) {
    let pairs = gate.iter_mut().zip(up);
    match act {
        FfnActivation::Silu => pairs.for_each(|(g, &u)| *g = silu(*g) * u),
        FfnActivation::GeluTanh => pairs.for_each(|(g, &u)| *g = gelu_tanh(*g) * u),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// One vector of `exp`'s lanes, or `None` when a lane needs the two-factor scale.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn exp16(x: __m512) -> Option<__m512> {
        let z = _mm512_fmadd_ps(x, _mm512_set1_ps(f(LOG2_E)), _mm512_set1_ps(f(SHIFT)));
        let n = _mm512_sub_ps(z, _mm512_set1_ps(f(SHIFT)));
        let wide = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(126.0));
        if wide != 0 {
            return None;
        }
        let b = _mm512_fnmadd_ps(
            n,
            _mm512_set1_ps(f(LN2_LO)),
            _mm512_fnmadd_ps(n, _mm512_set1_ps(f(LN2_HI)), x),
        );
        let u = _mm512_mul_ps(b, b);
        let c = |bits: u32| _mm512_set1_ps(f(bits));
        let hi = _mm512_fmadd_ps(c(C5), b, c(C4));
        let lo = _mm512_fmadd_ps(c(C3), b, c(C2));
        let one = _mm512_set1_ps(1.0);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(hi, u, lo),
            u,
            _mm512_fmadd_ps(c(C1), b, one),
        );
        Some(_mm512_scalef_ps(j, n))
    }

    /// `act(x)` of one vector, or `None` where the scalar reference takes it.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn act16(act: FfnActivation, x: __m512) -> Option<__m512> {
        let one = _mm512_set1_ps(1.0);
        match act {
            FfnActivation::Silu => {
                let e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))?;
                Some(_mm512_div_ps(x, _mm512_add_ps(one, e)))
            }
            FfnActivation::GeluTanh => {
                let arg = _mm512_mul_ps(
                    _mm512_fmadd_ps(x, _mm512_mul_ps(_mm512_set1_ps(GELU_A), x), one),
                    _mm512_mul_ps(_mm512_set1_ps(GELU_B), x),
                );
                let past = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(arg, _mm512_set1_ps(GELU_CUTOFF));
                if past != 0 {
                    return None;
                }
                let e = exp16(arg)?;
                Some(_mm512_mul_ps(x, _mm512_div_ps(e, _mm512_add_ps(e, one))))
            }
        }
    }

    /// The whole 16-value vectors of `gate`; returns how many values were done.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, AVX2 and FMA.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn gated16(act: FfnActivation, gate: &mut [f32], up: &[f32]) -> usize {
        let whole = gate.len() / 16 * 16;
        for (g, u) in gate[..whole].chunks_exact_mut(16).zip(up.chunks_exact(16)) {
            // SAFETY: `g` and `u` are 16 f32 each.
            let (x, y) = unsafe { (_mm512_loadu_ps(g.as_ptr()), _mm512_loadu_ps(u.as_ptr())) };
            match act16(act, x) {
                // SAFETY: as above.
                Some(a) => unsafe { _mm512_storeu_ps(g.as_mut_ptr(), _mm512_mul_ps(a, y)) },
                None => scalar(act, g, u),
            }
        }
        whole
    }

    /// [`exp16`] on 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn exp8(x: __m256) -> Option<__m256> {
        let z = _mm256_fmadd_ps(x, _mm256_set1_ps(f(LOG2_E)), _mm256_set1_ps(f(SHIFT)));
        let n = _mm256_sub_ps(z, _mm256_set1_ps(f(SHIFT)));
        let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
        let wide = _mm256_cmp_ps::<_CMP_GT_OQ>(abs, _mm256_set1_ps(126.0));
        if _mm256_movemask_ps(wide) != 0 {
            return None;
        }
        let b = _mm256_fnmadd_ps(
            n,
            _mm256_set1_ps(f(LN2_LO)),
            _mm256_fnmadd_ps(n, _mm256_set1_ps(f(LN2_HI)), x),
        );
        let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
        let k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_set1_epi32(0x3f80_0000)));
        let u = _mm256_mul_ps(b, b);
        let c = |bits: u32| _mm256_set1_ps(f(bits));
        let hi = _mm256_fmadd_ps(c(C5), b, c(C4));
        let lo = _mm256_fmadd_ps(c(C3), b, c(C2));
        let one = _mm256_set1_ps(1.0);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(hi, u, lo),
            u,
            _mm256_fmadd_ps(c(C1), b, one),
        );
        Some(_mm256_mul_ps(j, k))
    }

    /// [`act16`] on 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn act8(act: FfnActivation, x: __m256) -> Option<__m256> {
        let one = _mm256_set1_ps(1.0);
        match act {
            FfnActivation::Silu => {
                let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))?;
                Some(_mm256_div_ps(x, _mm256_add_ps(one, e)))
            }
            FfnActivation::GeluTanh => {
                let arg = _mm256_mul_ps(
                    _mm256_fmadd_ps(x, _mm256_mul_ps(_mm256_set1_ps(GELU_A), x), one),
                    _mm256_mul_ps(_mm256_set1_ps(GELU_B), x),
                );
                let past = _mm256_cmp_ps::<_CMP_GT_OQ>(arg, _mm256_set1_ps(GELU_CUTOFF));
                if _mm256_movemask_ps(past) != 0 {
                    return None;
                }
                let e = exp8(arg)?;
                Some(_mm256_mul_ps(x, _mm256_div_ps(e, _mm256_add_ps(e, one))))
            }
        }
    }

    /// [`gated16`] on 8-value vectors.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gated8(act: FfnActivation, gate: &mut [f32], up: &[f32]) -> usize {
        let whole = gate.len() / 8 * 8;
        for (g, u) in gate[..whole].chunks_exact_mut(8).zip(up.chunks_exact(8)) {
            // SAFETY: `g` and `u` are 8 f32 each.
            let (x, y) = unsafe { (_mm256_loadu_ps(g.as_ptr()), _mm256_loadu_ps(u.as_ptr())) };
            match act8(act, x) {
                // SAFETY: as above.
                Some(a) => unsafe { _mm256_storeu_ps(g.as_mut_ptr(), _mm256_mul_ps(a, y)) },
                None => scalar(act, g, u),
            }
        }
        whole
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use std::arch::aarch64::*;

    /// One vector of `exp`'s lanes, or `None` when a lane needs the two-factor scale.
    #[inline]
    #[target_feature(enable = "neon")]
    fn exp4(x: float32x4_t) -> Option<float32x4_t> {
        let shift = vdupq_n_f32(f(SHIFT));
        let z = vfmaq_f32(shift, x, vdupq_n_f32(f(LOG2_E)));
        let n = vsubq_f32(z, shift);
        if vmaxvq_u32(vcagtq_f32(n, vdupq_n_f32(126.0))) != 0 {
            return None;
        }
        let b = vfmsq_f32(
            vfmsq_f32(x, n, vdupq_n_f32(f(LN2_HI))),
            n,
            vdupq_n_f32(f(LN2_LO)),
        );
        let e = vshlq_n_u32::<23>(vreinterpretq_u32_f32(z));
        let k = vreinterpretq_f32_u32(vaddq_u32(e, vdupq_n_u32(0x3f80_0000)));
        let u = vmulq_f32(b, b);
        let c = |bits: u32| vdupq_n_f32(f(bits));
        let hi = vfmaq_f32(c(C4), c(C5), b);
        let lo = vfmaq_f32(c(C2), c(C3), b);
        let j = vfmaq_f32(
            vfmaq_f32(vdupq_n_f32(1.0), c(C1), b),
            vfmaq_f32(lo, hi, u),
            u,
        );
        Some(vmulq_f32(j, k))
    }

    /// `act(x)` of one vector, or `None` where the scalar reference takes it.
    #[inline]
    #[target_feature(enable = "neon")]
    fn act4(act: FfnActivation, x: float32x4_t) -> Option<float32x4_t> {
        let one = vdupq_n_f32(1.0);
        match act {
            FfnActivation::Silu => {
                let e = exp4(vsubq_f32(vdupq_n_f32(0.0), x))?;
                Some(vdivq_f32(x, vaddq_f32(one, e)))
            }
            FfnActivation::GeluTanh => {
                let arg = vmulq_f32(
                    vfmaq_f32(one, x, vmulq_f32(vdupq_n_f32(GELU_A), x)),
                    vmulq_f32(vdupq_n_f32(GELU_B), x),
                );
                if vmaxvq_u32(vcgtq_f32(arg, vdupq_n_f32(GELU_CUTOFF))) != 0 {
                    return None;
                }
                let e = exp4(arg)?;
                Some(vmulq_f32(x, vdivq_f32(e, vaddq_f32(e, one))))
            }
        }
    }

    /// The whole 4-value vectors of `gate`; returns how many values were done.
    ///
    /// # Safety
    /// NEON (the aarch64 baseline).
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn gated4(act: FfnActivation, gate: &mut [f32], up: &[f32]) -> usize {
        let whole = gate.len() / 4 * 4;
        for (g, u) in gate[..whole].chunks_exact_mut(4).zip(up.chunks_exact(4)) {
            // SAFETY: `g` and `u` are 4 f32 each.
            let (x, y) = unsafe { (vld1q_f32(g.as_ptr()), vld1q_f32(u.as_ptr())) };
            match act4(act, x) {
                // SAFETY: as above.
                Some(a) => unsafe { vst1q_f32(g.as_mut_ptr(), vmulq_f32(a, y)) },
                None => scalar(act, g, u),
            }
        }
        whole
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs over the useful range and past it: a fine sweep of [−120, 120], the
    /// neighbourhoods of the branch points, and pseudo-random finite floats of every magnitude.
    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (-240_000..=240_000).map(|i| i as f32 / 2000.0).collect();
        for edge in [0.0f32, 30.0, 87.3, 88.38, 103.97, 126.0, 192.0] {
            for s in [-1.0f32, 1.0] {
                let mut x = s * edge;
                for _ in 0..64 {
                    v.push(x);
                    x = f32::from_bits(x.to_bits() + 1);
                }
            }
        }
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let x = f32::from_bits((s >> 32) as u32);
            if x.is_finite() {
                v.push(x);
            }
        }
        v
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_true_value() {
        let mut worst = 0.0f64;
        for x in (-103_900..=88_300).map(|i| i as f32 / 1000.0) {
            let want = f64::from(x).exp();
            let got = f64::from(exp(x));
            if want < f64::from(f32::MIN_POSITIVE) {
                continue;
            }
            let ulp = f64::from(f32::EPSILON) * want;
            worst = worst.max((got - want).abs() / ulp);
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-110.0), 0.0);
        assert_eq!(exp(100.0), f32::INFINITY);
    }

    #[test]
    fn silu_matches_f64_and_saturates() {
        for i in 0..=20_000 {
            let x = -100.0 + 200.0 * i as f32 / 20_000.0;
            let want = f64::from(x) / (1.0 + (-f64::from(x)).exp());
            let got = f64::from(silu(x));
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1e-30),
                "silu({x}) = {got}, want {want}"
            );
        }
        assert_eq!(silu(-1000.0), 0.0);
        assert_eq!(silu(1000.0), 1000.0);
    }

    #[test]
    fn gelu_tanh_matches_the_tanh_formula_in_f64_and_saturates() {
        for i in 0..=20_000 {
            let x = -20.0 + 40.0 * i as f32 / 20_000.0;
            let xd = f64::from(x);
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd * xd * xd);
            let want = 0.5 * xd * (1.0 + inner.tanh());
            let got = f64::from(gelu_tanh(x));
            assert!(
                (got - want).abs() <= 2e-6 * want.abs().max(1e-3),
                "gelu({x}) = {got}, want {want}"
            );
        }
        assert_eq!(gelu_tanh(-1000.0), 0.0);
        assert_eq!(gelu_tanh(1000.0), 1000.0);
        assert_eq!(gelu_tanh(0.0), 0.0);
    }

    #[test]
    fn every_instruction_set_gives_the_scalar_reference_bits() {
        let gate = inputs();
        let up: Vec<f32> = gate.iter().rev().map(|&x| x * 0.25 + 0.5).collect();
        for act in [FfnActivation::Silu, FfnActivation::GeluTanh] {
            let mut want = gate.clone();
            gated(Isa::Scalar, act, &mut want, &up);
            for isa in Isa::all_available() {
                // An odd length leaves a scalar tail too.
                for len in [gate.len(), gate.len() - 3] {
                    let mut got = gate[..len].to_vec();
                    gated(isa, act, &mut got, &up[..len]);
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                            "{isa:?} {act:?} at x = {}: {g} against {w}",
                            gate[i]
                        );
                    }
                }
            }
        }
    }
}
