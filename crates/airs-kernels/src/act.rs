//! Activation quantizers as ggml's CPU backend runs them, which is not always its reference
//! quantizer: on x86 and aarch64 `quantize_row_q8_0` multiplies by `127 / amax` and rounds half
//! to even (`_mm256_round_ps(.., _MM_ROUND_NEAREST)`, `vcvtnq_s32_f32`), where the reference
//! divides by `amax / 127` and rounds half away from zero. Which one runs changes a few
//! quantized values per block, and in models with large activation outliers (Qwen2.5) that
//! moves logits by ~0.1, so airs quantizes activations the way llama.cpp actually does.
//! Cost: O(n), one pass.

use half::f16;

/// ggml block_q8_0 bytes.
const Q8_0_BLOCK_BYTES: usize = 34;

/// Quantize `x` into ggml `block_q8_0`s exactly as ggml's SIMD `quantize_row_q8_0` does.
pub(crate) fn quantize_q8_0_like_ggml_simd(x: &[f32], out: &mut [u8]) {
    for (block, o) in x
        .chunks_exact(32)
        .zip(out.chunks_exact_mut(Q8_0_BLOCK_BYTES))
    {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        o[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        for (q, &v) in o[2..].iter_mut().zip(block) {
            *q = (v * id).round_ties_even() as i8 as u8;
        }
    }
}
