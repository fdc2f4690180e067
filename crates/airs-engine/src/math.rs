//! The attention softmax's `exp`, in plain f32 arithmetic that the compiler vectorizes (libm's
//! `expf` is a call per element), and its f64 twin for the log-partition of a vocabulary's
//! logits ([`exp_f64`]); and the largest of many values ([`largest`]), which a softmax
//! subtracts. (The feed-forward's SiLU and GELU have their own, ggml's, in
//! `airs_kernels::gated`.)
//!
//! Method (Cody–Waite, as Cephes and ggml's `ggml_v_expf`): x = n·ln 2 + r with n the nearest
//! integer to x·log2 e (rounded by adding and subtracting 1.5·2^23, which SSE2 vectorizes; the
//! integer read from the sum's mantissa bits) and |r| ≤ ln 2 / 2, ln 2 split in two so that
//! n·LN2_HI is exact; e^r by its degree-7 Taylor polynomial (truncation below 1e-8 relative);
//! 2^n applied through the exponent bits in two halves so that every n in [−126, 128] stays a
//! normal scale. Relative error below 4 ulp
//! (tested against f64 over the whole range); x is clamped to [−87.33, 89], so results
//! underflow to ~1.2e−38 and overflow to infinity as e^x does. No operation is fused or
//! reordered, so every instruction-set build computes the same bits.
//! Cost: ~20 vector instructions per 8 values.

/// e^x (see the module documentation).
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // Cephes' split: LN2_HI has 9 significant bits, so n · LN2_HI is exact for |n| < 2^15.
    const LN2_HI: f32 = 0.693_359_4; // 355/512
    const LN2_LO: f32 = -2.121_944_4e-4; // ln 2 − LN2_HI
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2^23: t + ROUND − ROUND rounds t to an integer
    let x = x.clamp(-87.33, 89.0);
    let shifted = x * LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.0 / 5040.0;
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p * r + c;
    }
    // 2^n = 2^a · 2^b with a, b ∈ [−63, 64]: both normal floats.
    // n as an integer: `shifted` is 1.5·2^23 + n, whose low mantissa bits hold n (|n| ≤ 130).
    // (An `as i32` cast saturates and maps NaN, which the compiler does lane by lane.)
    let n = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    let a = n >> 1;
    let b = n - a;
    let pow2 = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    p * pow2(a) * pow2(b)
}

/// The largest value of `x` (NaNs ignored; −∞ when none), and whether `x` holds a NaN: one
/// pass in 16 interleaved partial maxima so that every build vectorizes it (a maximum is exact,
/// so any grouping gives the same value; a fold's dependent chain cost several cycles per
/// value). A maximum of 0 may come out as either zero. Inlined, a caller that ignores the NaN
/// flag does not pay for it.
#[inline(always)]
pub(crate) fn largest(x: &[f32]) -> (f32, bool) {
    // `v > m` rather than `f32::max`: a NaN never compares greater, and the select is one
    // compare and blend where `max`'s NaN rule takes three instructions (the sampler's
    // log-partition took 5 % less time with it).
    let larger = |m: f32, v: f32| if v > m { v } else { m };
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut nan = false;
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            nan |= v.is_nan();
            *m = larger(*m, v);
        }
    }
    let mut max = lanes.iter().fold(f32::NEG_INFINITY, |m, &v| larger(m, v));
    for &v in chunks.remainder() {
        nan |= v.is_nan();
        max = larger(max, v);
    }
    (max, nan)
}

/// e^x in f64, by the same method as [`exp`] with f64 constants: ln 2 split as Cephes' `exp`
/// splits it (`n·LN2_HI` exact for |n| < 2^11), e^r by its degree-13 Taylor polynomial
/// (truncation below 5·10⁻¹⁸ relative for |r| ≤ ln 2 / 2), x clamped to [−708.39, 710] so that
/// results stay normal (a smaller x gives ~2.2·10⁻³⁰⁸, not 0) and overflow to infinity above.
/// Relative error within 4 f64 ulp (tested against libm); plain arithmetic that the compiler
/// vectorizes, where libm's `exp` is a call per value. Cost: ~35 vector instructions per
/// 2 values (SSE2), per 8 with AVX-512.
#[inline(always)]
pub(crate) fn exp_f64(x: f64) -> f64 {
    const LOG2_E: f64 = std::f64::consts::LOG2_E;
    const LN2_HI: f64 = 6.931_457_519_531_25e-1;
    const LN2_LO: f64 = 1.428_606_820_309_417_3e-6;
    const ROUND: f64 = 6_755_399_441_055_744.0; // 1.5 · 2^52
    let x = x.clamp(-708.39, 710.0);
    let shifted = x * LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.0 / 6_227_020_800.0; // 1/13!
    for c in [
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p * r + c;
    }
    let n = shifted.to_bits() as i64 - ROUND.to_bits() as i64;
    let a = n >> 1;
    let b = n - a;
    let pow2 = |k: i64| f64::from_bits(((k + 1023) as u64) << 52);
    p * pow2(a) * pow2(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_a_few_ulp_over_the_whole_range() {
        let mut worst = 0.0f64;
        for i in 0..=400_000 {
            let x = -87.0 + 175.5 * i as f32 / 400_000.0;
            let got = f64::from(exp(x));
            let want = f64::from(x).exp();
            worst = worst.max((got - want).abs() / want);
        }
        assert!(
            worst < 4.0 * f64::from(f32::EPSILON),
            "relative error {worst}"
        );
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-1000.0) > 0.0 && exp(-1000.0) < 1.2e-38);
        assert!(exp(f32::NEG_INFINITY) < 1.2e-38);
        assert_eq!(exp(89.0), f32::INFINITY);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
    }

    #[test]
    fn exp_f64_is_within_a_few_ulp_over_the_whole_range() {
        let mut worst = 0.0f64;
        for i in 0..=1_000_000 {
            let x = -708.0 + 1417.0 * i as f64 / 1_000_000.0;
            let (got, want) = (exp_f64(x), x.exp());
            worst = worst.max((got - want).abs() / want);
        }
        // Near 0, where a softmax's largest terms are.
        for i in 0..=100_000 {
            let x = -1.0 + 2.0 * i as f64 / 100_000.0;
            let (got, want) = (exp_f64(x), x.exp());
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst < 4.0 * f64::EPSILON, "relative error {worst}");
        assert_eq!(exp_f64(0.0), 1.0);
        assert!(exp_f64(-1000.0) > 0.0 && exp_f64(-1000.0) < 2.3e-308);
        assert!(exp_f64(f64::NEG_INFINITY) < 2.3e-308);
        assert_eq!(exp_f64(710.0), f64::INFINITY);
        assert!(exp_f64(f64::NAN).is_nan());
    }
}
