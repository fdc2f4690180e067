//! Gemma 3 270M (Q4_K_M, installed at test time: its licence keeps it out of the repository):
//! the sliding-window layers (window 512, five of every six layers) attend through the paged
//! cache exactly as through the contiguous one, for block sizes that put a window's first
//! position inside a block, and whatever the prompt's chunking. Its distributions against
//! ik_llama.cpp's are held in airs-runtime's tests (`gemma_next_token_distributions_...`).
mod paged_common;

use airs_engine::{ContiguousKv, KvCache, KvType, Logits, Model, PagedKv, Runtime};
use paged_common::{load, pool, shape};

/// The first `n` tokens of the design chapter as ik_llama.cpp tokenized it (BOS first).
fn design_tokens(n: usize) -> Vec<u32> {
    let path =
        airs_testdata::repo_path("testdata/reference/gemma-3-270m-q4km.kld-design.kvf16.json");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    json["text_token_ids"].as_array().unwrap()[..n]
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// The last logits of every prompt chunk of `chunk` tokens, then of `steps` greedy tokens.
fn run(
    model: &Model,
    kv: &mut dyn KvCache,
    prompt: &[u32],
    chunk: usize,
    steps: usize,
) -> Vec<Vec<f32>> {
    let rt = Runtime::new(2);
    let mut rows: Vec<Vec<f32>> = prompt
        .chunks(chunk)
        .map(|c| model.forward(&rt, kv, c, Logits::Last).unwrap())
        .collect();
    for _ in 0..steps {
        let next = airs_engine::sampler::argmax(rows.last().unwrap());
        rows.push(model.forward(&rt, kv, &[next], Logits::Last).unwrap());
    }
    rows
}

fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter()
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

#[test]
fn sliding_window_layers_attend_the_same_positions_through_paged_and_contiguous_caches() {
    let model = load(&airs_testdata::gemma_path());
    let window = model.config.layer_window(0).expect("layer 0 is local");
    assert_eq!(window, 512);
    assert_eq!(
        model.config.layer_window(5),
        None,
        "every sixth layer is global"
    );
    // 600 prompt tokens and 6 decoded: the windows of the last ~100 positions start inside
    // the cache, at every offset within a block.
    let prompt = design_tokens(600);
    let ty = KvType::F16;
    let mut contiguous = ContiguousKv::new(shape(&model), 640, ty);
    let want = run(&model, &mut contiguous, &prompt, 200, 6);
    for (tokens_per_block, chunk) in [(16, 200), (7, 600), (7, 97)] {
        let kv_pool = pool(
            &model,
            ty,
            tokens_per_block,
            640usize.div_ceil(tokens_per_block as usize),
        );
        let mut paged = PagedKv::new_sequence(&kv_pool, None);
        let got = run(&model, &mut paged, &prompt, chunk, 6);
        // Chunkings differ in how many rows they return: compare the final prompt row and
        // every decoded one.
        let tail = |rows: &[Vec<f32>]| bits(&rows[rows.len() - 7..]);
        assert!(
            tail(&got) == tail(&want),
            "{tokens_per_block} positions per block, chunks of {chunk}"
        );
    }
}
