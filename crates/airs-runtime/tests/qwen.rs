//! The real Qwen2.5-Coder-0.5B (Q4_K_M, ChatML template): a short workload overflowing a pool of
//! a few blocks evicts and rebuilds sessions (the turns of a time step served together), and
//! every reply equals the reply of a run that never evicts.
mod common;

use std::sync::Arc;

use airs_memory::PinPolicy;
use airs_runtime::LoadedModel;
use airs_runtime::workload::{BenchConfig, Workload, run_bench};

#[test]
fn qwen_sessions_rebuild_to_identical_replies() {
    let path = airs_testdata::qwen_path();
    let w = Workload::from_json(
        r#"{
        "name": "qwen-tiny", "max_tokens": 4, "step_seconds": 400,
        "sessions": [
          {"name": "chat", "priority": "interactive", "steps": [0, 2], "turns": ["Hi!", "Say it again."]},
          {"name": "svc", "priority": "system", "system": "Answer yes or no.", "steps": [0, 1],
           "turns": ["Is the sky blue?", "Is fire cold?"]},
          {"name": "bg", "priority": "background", "steps": [1, 2],
           "turns": ["Summarize: apples are red.", "Summarize: the sea is deep."]}
        ]}"#,
    )
    .unwrap();
    let mut c = BenchConfig::new(7 * 196_608);
    c.pin = PinPolicy::None;
    c.verify = true;
    c.reference_pool_bytes = Some(64 << 20);
    let model = Arc::new(LoadedModel::open(&path, 2).unwrap());
    let reference = Arc::new(LoadedModel::open(&path, 2).unwrap());
    let report = run_bench(&model, Some(&reference), &c, &w).unwrap();
    println!("{report}");
    assert!(report.ok(), "{report}");
    assert_eq!(report.failed_requests, 0, "{report}");
    assert!(report.rebuilt_tokens > 0, "{report}");
    assert_eq!(
        report.verification.as_ref().unwrap().identical,
        report.requests
    );
}

/// The quality gate: airs's next-token distributions over the design chapter (4 chunks of 512
/// tokens, 1,020 scored positions) against llama.cpp c392e509's, by llama-perplexity's protocol
/// and the top-32 + tail KL divergence (`airs_runtime::perplexity`). For scale, llama.cpp
/// against itself with f16 instead of f32 KV gives a mean of 0.00087 by this formula and 98.1%
/// top-1 agreement; ik_llama.cpp against llama.cpp 0.00084 and 98.1%.
///
/// Held here, the issue's targets: mean KLD ≤ 0.0010, top-1 agreement ≥ 98.0% and perplexity
/// within 1% of the reference's, with both KV types. Measured (2026-12-03, SiLU on ggml's
/// AVX-512 `exp`, `airs_kernels::gated`): f16 0.000796, 98.33%, perplexity 13.082 vs 13.059;
/// f32 0.000809, 98.43%, 13.061 vs 13.071 (2026-12-02, libm's `expf`: f16 0.000827, 98.24%;
/// f32 0.000840, 98.73%). The margin is a few positions: with the earlier score
/// order (eight chains per row) f16 gave 0.000799 and 97.75%, since 39 reference positions have
/// their two best tokens within 1% of probability and summation order decides them. Every
/// disagreement is such a near-tie of the reference (llama.cpp preferred its own token by at
/// most 0.115 nats with f16 KV, 18 positions, and 0.214 with f32, 13) — held at the greedy
/// tests' near-tie margin, 0.3; a wrong computation disagrees where the reference is sure.
#[test]
fn qwen_next_token_distributions_match_llama_cpp_on_the_design_text() {
    use airs_engine::KvType;
    let model = LoadedModel::open(&airs_testdata::qwen_path(), 2).unwrap();
    for kv_type in [KvType::F16, KvType::F32] {
        let stem = format!("qwen2.5-coder-0.5b-q4km.kld-design.kv{}", kv_type.name());
        let k = common::design_text_divergence(&model, &stem, 512, 4, kv_type, true);
        assert!(k.mean <= 0.0010, "{stem}: mean KLD {}", k.mean);
        assert!(
            k.top1_agreement >= 0.980,
            "{stem}: top-1 {}",
            k.top1_agreement
        );
        assert!(
            k.max_disagreement_margin() <= 0.3,
            "{stem}: a confident disagreement: {:?}",
            k.disagreements
        );
    }
}
