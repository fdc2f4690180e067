//! The small synthesized seed files of the `gguf_parse` fuzz target (`fuzz/seeds/`).
//!
//! They are generated here from the writer, so they stay valid as the format code changes:
//! this test checks that each seed parses completely and that the committed copy is
//! byte-identical; `AIRS_WRITE_FUZZ_SEEDS=1 cargo test -p airs-gguf --test fuzz_seeds`
//! (re)writes them.
mod common;

use std::path::PathBuf;

use airs_gguf::writer::MetaValue;
use airs_gguf::{GgmlType, Gguf, LayerMap, ModelConfig};
use common::*;

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let (llama_kv, llama_t) = tiny_llama();

    let qwen_kv = vec![
        kv("general.architecture", MetaValue::String("qwen2".into())),
        kv("qwen2.block_count", MetaValue::U32(1)),
        kv("qwen2.context_length", MetaValue::U64(128)),
        kv("qwen2.embedding_length", MetaValue::U32(32)),
        kv("qwen2.feed_forward_length", MetaValue::U32(64)),
        kv("qwen2.attention.head_count", MetaValue::U32(4)),
        kv("qwen2.attention.head_count_kv", MetaValue::U32(2)),
        kv("qwen2.rope.freq_base", MetaValue::F32(1_000_000.0)),
        kv(
            "qwen2.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-6),
        ),
        kv("tokenizer.ggml.model", MetaValue::String("gpt2".into())),
        kv(
            "tokenizer.ggml.tokens",
            MetaValue::strings(["a", "b", "c", "ab"]),
        ),
        kv("tokenizer.ggml.merges", MetaValue::strings(["a b"])),
    ];
    let qwen_t = vec![
        tensor("token_embd.weight", &[32, 4], GgmlType::Q8_0),
        tensor("output_norm.weight", &[32], GgmlType::F32),
        tensor("blk.0.attn_q.weight", &[32, 32], GgmlType::Q4_0),
        tensor("blk.0.attn_q.bias", &[32], GgmlType::F32),
        tensor("blk.0.attn_k.weight", &[32, 16], GgmlType::F16),
        tensor("blk.0.attn_k.bias", &[16], GgmlType::BF16),
        tensor("blk.0.ffn_down.weight", &[256, 1], GgmlType::Q4K),
        tensor("blk.0.ffn_up.weight", &[256, 1], GgmlType::Q6K),
    ];

    // gemma3: head dim from key_length, the sliding window; phi3: fused tensors, partial
    // rotary, LongRoPE factors and their metadata.
    let gemma_kv = vec![
        kv("general.architecture", MetaValue::String("gemma3".into())),
        kv("gemma3.block_count", MetaValue::U32(6)),
        kv("gemma3.embedding_length", MetaValue::U32(32)),
        kv("gemma3.feed_forward_length", MetaValue::U32(64)),
        kv("gemma3.attention.head_count", MetaValue::U32(2)),
        kv("gemma3.attention.head_count_kv", MetaValue::U32(1)),
        kv("gemma3.attention.key_length", MetaValue::U32(32)),
        kv("gemma3.attention.value_length", MetaValue::U32(32)),
        kv("gemma3.attention.sliding_window", MetaValue::U32(8)),
        kv("gemma3.rope.freq_base", MetaValue::F32(1_000_000.0)),
    ];
    let gemma_t = vec![
        tensor("token_embd.weight", &[32, 4], GgmlType::Q8_0),
        tensor("blk.0.attn_q_norm.weight", &[32], GgmlType::F32),
        tensor("blk.0.post_ffw_norm.weight", &[32], GgmlType::F32),
    ];
    let phi_kv = vec![
        kv("general.architecture", MetaValue::String("phi3".into())),
        kv("phi3.block_count", MetaValue::U32(1)),
        kv("phi3.context_length", MetaValue::U32(131_072)),
        kv("phi3.embedding_length", MetaValue::U32(32)),
        kv("phi3.feed_forward_length", MetaValue::U32(64)),
        kv("phi3.attention.head_count", MetaValue::U32(2)),
        kv("phi3.rope.dimension_count", MetaValue::U32(12)),
        kv("phi3.attention.sliding_window", MetaValue::U32(16)),
        kv("phi3.rope.scaling.attn_factor", MetaValue::F32(1.19)),
        kv(
            "phi3.rope.scaling.original_context_length",
            MetaValue::U32(4096),
        ),
    ];
    let phi_t = vec![
        tensor("token_embd.weight", &[32, 4], GgmlType::Q8_0),
        tensor("rope_factors_long.weight", &[8], GgmlType::F32),
        tensor("rope_factors_short.weight", &[8], GgmlType::F32),
        tensor("blk.0.attn_qkv.weight", &[32, 96], GgmlType::Q8_0),
        tensor("blk.0.ffn_up.weight", &[32, 128], GgmlType::Q8_0),
    ];

    let mut all_kv = all_types_metadata();
    all_kv.push(kv("general.alignment", MetaValue::U32(64)));
    all_kv.push(kv("a.nested_8", nested_array(airs_gguf::MAX_ARRAY_DEPTH)));
    let all_t = vec![
        tensor("scalar", &[], GgmlType::F32),
        tensor("four_d", &[2, 2, 2, 2], GgmlType::I8),
        tensor("blk.3.f64", &[3], GgmlType::F64),
        tensor("blk.1.i16", &[1, 5], GgmlType::I16),
        tensor("blk.1.i32", &[2], GgmlType::I32),
        tensor("i64", &[1], GgmlType::I64),
        tensor("iq4nl", &[32, 1, 1], GgmlType::IQ4NL),
    ];

    let mut v2 = small().bytes;
    put_u32(&mut v2, VERSION_AT, 2);

    vec![
        ("tiny_llama.gguf", build(&llama_kv, &llama_t, 32)),
        ("tiny_qwen2_quant.gguf", build(&qwen_kv, &qwen_t, 32)),
        ("tiny_gemma3.gguf", build(&gemma_kv, &gemma_t, 32)),
        ("tiny_phi3.gguf", build(&phi_kv, &phi_t, 32)),
        ("all_types_align64.gguf", build(&all_kv, &all_t, 64)),
        ("small.gguf", small().bytes),
        ("small_v2.gguf", v2),
        ("empty.gguf", build(&[], &[], 32)),
    ]
}

fn seed_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds")
}

#[test]
fn fuzz_seeds_are_valid_and_committed_copies_match() {
    let dir = seed_dir();
    let write = std::env::var_os("AIRS_WRITE_FUZZ_SEEDS").is_some();
    let mut total = 0;
    for (name, bytes) in seeds() {
        let g = Gguf::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        for t in g.tensors() {
            assert_eq!(g.tensor_data(t).len() as u64, t.bytes, "{name}");
        }
        let _ = LayerMap::new(&g);
        if name.starts_with("tiny_") {
            ModelConfig::from_gguf(&g).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        total += bytes.len();
        let path = dir.join(name);
        if write {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        } else if let Ok(committed) = std::fs::read(&path) {
            assert!(
                committed == bytes,
                "{} is stale: rerun with AIRS_WRITE_FUZZ_SEEDS=1",
                path.display()
            );
        }
    }
    assert!(total < 100 * 1024, "seeds total {total} bytes");
}
