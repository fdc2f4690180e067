//! Helpers shared by the paged-cache tests (`tests/paged_*.rs`).
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use airs_engine::{
    KvCache, KvShape, KvType, Logits, MappedFile, Model, PagedKvConfig, PagedKvPool, Runtime,
};
use airs_memory::PinPolicy;

pub fn load(path: &Path) -> Model {
    let image = Arc::new(MappedFile::open(path).unwrap());
    let gguf = airs_gguf::Gguf::parse(airs_engine::ModelImage::bytes(&*image)).unwrap();
    Model::new(image.clone(), &gguf).unwrap()
}

pub fn shape(model: &Model) -> KvShape {
    KvShape {
        layers: model.config.layers,
        kv_heads: model.config.kv_heads,
        head_dim: model.config.head_dim,
    }
}

/// A pool of `blocks` blocks of `tokens_per_block` positions for `model`'s caches of `ty`.
pub fn pool(model: &Model, ty: KvType, tokens_per_block: u32, blocks: usize) -> PagedKvPool {
    let bytes_per_token = shape(model).bytes_per_token(ty).unwrap();
    let config = PagedKvConfig {
        pool_bytes: blocks * tokens_per_block as usize * bytes_per_token,
        tokens_per_block,
        pin: PinPolicy::None,
        huge_pages: true,
    };
    PagedKvPool::new(shape(model), ty, &config).unwrap()
}

/// A greedy run: `prompt` prefilled in chunks of `chunk` tokens (all logits kept), then `steps`
/// greedy tokens. Returns every logits row computed, in order, and the generated ids.
pub fn greedy_run(
    model: &Model,
    rt: &Runtime,
    kv: &mut dyn KvCache,
    prompt: &[u32],
    chunk: usize,
    steps: usize,
) -> (Vec<Vec<f32>>, Vec<u32>) {
    let vocab = model.config.vocab_len;
    let mut rows = Vec::new();
    for c in prompt.chunks(chunk) {
        let logits = model.forward(rt, kv, c, Logits::All).unwrap();
        rows.extend(logits.chunks_exact(vocab).map(<[f32]>::to_vec));
    }
    let mut ids = Vec::new();
    for _ in 0..steps {
        let next = airs_engine::sampler::argmax(rows.last().unwrap());
        ids.push(next);
        if ids.len() == steps {
            break;
        }
        rows.push(model.forward(rt, kv, &[next], Logits::Last).unwrap());
    }
    (rows, ids)
}

/// Asserts two runs' logits are bit-for-bit equal.
pub fn assert_same_bits(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: number of logits rows");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let same = x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
        if !same {
            let max = x
                .iter()
                .zip(y)
                .map(|(p, q)| (p - q).abs())
                .fold(0.0f32, f32::max);
            panic!("{what}: logits row {i} differs (max abs diff {max})");
        }
    }
}
