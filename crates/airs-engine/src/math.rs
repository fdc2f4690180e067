//! The attention softmax's `exp`, in plain f32 arithmetic that the compiler vectorizes (libm's
//! `expf` is a call per element). (The feed-forward's SiLU and GELU have their own, ggml's, in
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
}
