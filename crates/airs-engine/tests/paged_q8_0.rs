//! The q8_0 KV cache on Qwen2.5-Coder-0.5B: half the bytes of f16 per position, and greedy
//! output equal to llama.cpp's (f16-KV) reference up to the first near tie.
mod paged_common;

use airs_engine::{KvShape, KvType, PagedKv, Runtime};
use airs_testdata::{QWEN_REFERENCES, Reference, qwen_path};
use paged_common::*;

/// The reference margin below which a greedy step may go either way with a q8_0 cache.
///
/// Measured on the three prompts, feeding the reference ids and comparing each step's margin
/// (reference token minus best other) with the reference's: an f16 cache deviates by 0.06-0.08
/// on average (at most 0.36: the kernels' noise floor, see tests/qwen.rs); a q8_0 cache by
/// 0.21-0.28 on average (at most 1.17). Quantizing K alone accounts for nearly all of it
/// (Qwen2's K projections have outlier channels that set each 32-value block's scale); V and
/// the q8_0 query add little. So a reference margin below the q8_0 cache's mean deviation,
/// rounded up to 0.3, is a near tie here. With it, 64 + 42 + 27 steps are compared; q8_0
/// actually matches all 64 on chat-prime and fibonacci, and on the inventory prompt flips the
/// step-27 near tie (reference margin 0.196).
const NEAR_TIE: f32 = 0.3;

#[test]
fn q8_0_halves_kv_bytes_per_token_versus_f16() {
    let qwen = KvShape {
        layers: 24,
        kv_heads: 2,
        head_dim: 64,
    };
    let f16 = qwen.bytes_per_token(KvType::F16).unwrap();
    let q8 = qwen.bytes_per_token(KvType::Q8_0).unwrap();
    assert_eq!((f16, q8), (12288, 6528));
    assert!(q8 as f64 / f16 as f64 <= 0.54);
    // stories260K's 8-value heads cannot be q8_0 blocks: a typed refusal, not a panic.
    let tiny = KvShape {
        layers: 5,
        kv_heads: 4,
        head_dim: 8,
    };
    assert!(tiny.bytes_per_token(KvType::Q8_0).is_none());
    let e = airs_engine::PagedKvPool::new(
        tiny,
        KvType::Q8_0,
        &airs_engine::PagedKvConfig::new(1 << 20),
    )
    .unwrap_err();
    assert!(e.to_string().contains("q8_0"), "{e}");
}

#[test]
fn q8_0_greedy_ids_match_the_reference_before_the_first_near_tie() {
    let model = load(&qwen_path());
    let rt = Runtime::new(2);
    let kv_pool = pool(&model, KvType::Q8_0, 16, 64);
    for stem in QWEN_REFERENCES.iter().filter(|s| s.ends_with("kvf16")) {
        let reference = Reference::load(stem);
        let steps = reference.steps_before_near_tie(NEAR_TIE);
        let mut kv = PagedKv::new_sequence(&kv_pool, None);
        let prompt = &reference.prompt_token_ids;
        let (_, ids) = greedy_run(&model, &rt, &mut kv, prompt, prompt.len(), steps.max(1));
        assert_eq!(
            &ids[..steps],
            &reference.greedy_token_ids[..steps],
            "{stem}: q8_0 greedy ids before the first margin < {NEAR_TIE}"
        );
        eprintln!("{stem}: q8_0 matches {steps} greedy ids");
    }
}
