//! Elementwise math the forward pass applies to every activation: an `exp` in plain f32
//! arithmetic that the compiler vectorizes (libm's `expf` is a call per element), used by the
//! attention softmax; SiLU and GELU, also here, keep libm's `expf` (see [`silu`]).
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

/// x · sigmoid(x), with libm's `expf`: SiLU feeds every feed-forward row, and the fast [`exp`]'s
/// few-ulp differences there were enough to flip a near-tie greedy step of the Qwen reference
/// (inventory prompt, f16 KV, step 61); the softmax tolerates them.
#[inline(always)]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU, tanh approximation `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, computed as
/// ggml's SIMD path does (`x · e/(e + 1)` with `e = exp(2·√(2/π)·x·(1 + 0.044715·x²))`, and
/// `x` itself once the argument passes 30), with libm's `expf` for the same reason as [`silu`].
#[inline(always)]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    const COEF_A: f32 = 0.044715;
    const TWO_SQRT_2_OVER_PI: f32 = 2.0 * 0.797_884_6;
    let arg = (x * (COEF_A * x) + 1.0) * (TWO_SQRT_2_OVER_PI * x);
    if arg > 30.0 {
        return x;
    }
    let e = arg.exp();
    x * (e / (e + 1.0))
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
}
