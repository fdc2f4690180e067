//! Helpers for the engine's tests on real model files.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use airs_engine::{ContiguousKv, KvCache, KvShape, KvType, Logits, MappedFile, Model, Runtime};
use airs_testdata::Reference;

pub fn load(path: &Path) -> Model {
    let image = Arc::new(MappedFile::open(path).unwrap());
    let gguf = airs_gguf::Gguf::parse(airs_engine::ModelImage::bytes(&*image)).unwrap();
    Model::new(image.clone(), &gguf).unwrap()
}

pub fn kv_shape(model: &Model) -> KvShape {
    KvShape {
        layers: model.config.layers,
        kv_heads: model.config.kv_heads,
        head_dim: model.config.head_dim,
    }
}

pub fn kv_type(reference: &Reference) -> KvType {
    reference.kv_cache_type.parse().unwrap()
}

/// Greedy generation of `steps` tokens after `prompt`, returning the prompt's next-token
/// logits and the generated ids.
pub fn greedy(
    model: &Model,
    rt: &Runtime,
    kv: &mut dyn KvCache,
    prompt: &[u32],
    steps: usize,
) -> (Vec<f32>, Vec<u32>) {
    let first = model.forward(rt, kv, prompt, Logits::Last).unwrap();
    let mut ids = Vec::with_capacity(steps);
    let mut logits = first.clone();
    for _ in 0..steps {
        let next = airs_engine::sampler::argmax(&logits);
        ids.push(next);
        if ids.len() == steps {
            break;
        }
        logits = model.forward(rt, kv, &[next], Logits::Last).unwrap();
    }
    (first, ids)
}

pub fn contiguous(model: &Model, ty: KvType, capacity: usize) -> ContiguousKv {
    ContiguousKv::new(kv_shape(model), capacity, ty)
}

/// Compare a run against a llama.cpp reference: top-10 logits within `tol`, greedy ids equal
/// up to the first step whose reference margin between the two best logits is below
/// `near_tie`.
pub fn check_against(reference: &Reference, logits: &[f32], ids: &[u32], tol: f32, near_tie: f32) {
    for r in &reference.next_token_top10 {
        let got = logits[r.id as usize];
        assert!(
            (got - r.logit).abs() <= tol,
            "token {}: logit {got}, reference {} (tolerance {tol})",
            r.id,
            r.logit
        );
    }
    check_greedy(reference, ids, near_tie);
}

/// Greedy ids equal to a llama.cpp reference's up to the first step whose reference margin
/// between the two best logits is below `near_tie`.
pub fn check_greedy(reference: &Reference, ids: &[u32], near_tie: f32) {
    let must_match = reference.steps_before_near_tie(near_tie).min(ids.len());
    assert_eq!(
        &ids[..must_match],
        &reference.greedy_token_ids[..must_match],
        "greedy ids differ before the first near tie (step {must_match})"
    );
}
