//! Helpers shared by the airs-synth integration tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use airs_synth::{QuantMix, Recipe, Shape, Vocabulary, default_vocab_dir};

/// The vocabulary of `shape`, loaded once per test binary.
pub fn vocab(shape: Shape) -> Arc<Vocabulary> {
    static CACHE: OnceLock<Mutex<HashMap<Shape, Arc<Vocabulary>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap();
    cache
        .entry(shape)
        .or_insert_with(|| Arc::new(Vocabulary::for_shape(shape, &default_vocab_dir()).unwrap()))
        .clone()
}

/// The bytes of a generated model.
pub fn generate(shape: Shape, quant: QuantMix, seed: u64, threads: usize) -> Vec<u8> {
    let mut out = Vec::new();
    Recipe::new(shape, quant, seed)
        .write(&mut out, &vocab(shape), threads)
        .unwrap();
    out
}

/// The small shapes, which tests generate in full.
pub const SMALL_SHAPES: [Shape; 3] = [Shape::Tiny, Shape::Qwen2Tiny, Shape::Qwen3Tiny];
