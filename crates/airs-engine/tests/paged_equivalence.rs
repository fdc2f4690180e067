//! The paged cache computes exactly what the contiguous cache (the oracle) computes: identical
//! logits, bit for bit, on both real models, for every KV type, block size and prefill split.
mod paged_common;

use airs_engine::{ContiguousKv, KvCache, KvType, PagedKv, Runtime};
use airs_testdata::{Reference, qwen_path, stories_path};
use paged_common::*;

#[test]
fn stories260k_paged_equals_contiguous_bit_for_bit() {
    let model = load(&stories_path());
    let rt = Runtime::new(2);
    let prompt = Reference::load("stories260K.prompt.kvf32").prompt_token_ids;
    for ty in [KvType::F32, KvType::F16] {
        let mut contiguous = ContiguousKv::new(shape(&model), 128, ty);
        let want = greedy_run(&model, &rt, &mut contiguous, &prompt, 5, 60);
        // Block sizes below, at and above the prefill chunk, and one spanning everything.
        for tokens_per_block in [1, 3, 16, 128] {
            let kv_pool = pool(&model, ty, tokens_per_block, 128);
            let mut paged = PagedKv::new_sequence(&kv_pool, None);
            let got = greedy_run(&model, &rt, &mut paged, &prompt, 5, 60);
            let what = format!("{ty:?}, {tokens_per_block} positions per block");
            assert_same_bits(&got.0, &want.0, &what);
            assert_eq!(got.1, want.1, "{what}");
            let blocks = paged.len().div_ceil(tokens_per_block as usize);
            assert_eq!(paged.allocated_bytes(), blocks * kv_pool.block_bytes());
        }
    }
}

#[test]
fn qwen_paged_equals_contiguous_bit_for_bit() {
    let model = load(&qwen_path());
    let rt = Runtime::new(2);
    let prompt = Reference::load("qwen2.5-coder-0.5b-q4km.chat-prime.kvf32").prompt_token_ids;
    for ty in [KvType::F32, KvType::F16, KvType::Q8_0] {
        let mut contiguous = ContiguousKv::new(shape(&model), 64, ty);
        let want = greedy_run(&model, &rt, &mut contiguous, &prompt, 20, 6);
        let kv_pool = pool(&model, ty, 16, 8);
        let mut paged = PagedKv::new_sequence(&kv_pool, None);
        let got = greedy_run(&model, &rt, &mut paged, &prompt, 20, 6);
        assert_same_bits(&got.0, &want.0, &format!("{ty:?}"));
        assert_eq!(got.1, want.1, "{ty:?}");
    }
}
