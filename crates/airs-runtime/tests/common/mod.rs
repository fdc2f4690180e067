//! Helpers shared by the runtime tests: stories260K models and small schedulers.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use airs_memory::PinPolicy;
use airs_runtime::{
    Collected, GenerationParams, HistoryStore, LoadedModel, ManualClock, Priority, Request, Result,
    Scheduler, SchedulerConfig,
};

/// Positions per block in the tests: small, so short conversations span several blocks.
pub const TPB: u32 = 8;

pub fn model() -> Arc<LoadedModel> {
    Arc::new(LoadedModel::open(&airs_testdata::stories_path(), 1).expect("stories260K"))
}

/// Bytes of one block of stories260K's f16 KV cache with `TPB` positions.
pub fn block_bytes(model: &LoadedModel) -> usize {
    let c = &model.model.config;
    2 * c.layers * c.kv_heads * c.head_dim * 2 * TPB as usize
}

pub fn config(blocks: usize, model: &LoadedModel) -> SchedulerConfig {
    let mut c = SchedulerConfig::new(blocks * block_bytes(model));
    c.tokens_per_block = TPB;
    c.pin = PinPolicy::None;
    c
}

/// A scheduler over an in-memory store with a pool of `blocks` blocks and a manual clock.
pub fn scheduler(blocks: usize, idle_threshold: Duration) -> (Scheduler, ManualClock) {
    let m = model();
    let mut c = config(blocks, &m);
    c.idle_threshold = idle_threshold;
    let clock = ManualClock::new();
    let s = Scheduler::with_clock(
        m,
        c,
        Some(HistoryStore::open_in_memory().unwrap()),
        Box::new(clock.clone()),
    )
    .unwrap();
    (s, clock)
}

pub fn greedy(max_tokens: usize) -> GenerationParams {
    GenerationParams {
        max_tokens,
        ..GenerationParams::default()
    }
}

/// One turn of session `name` at `priority`, served to completion.
pub fn turn(
    s: &mut Scheduler,
    name: &str,
    priority: Priority,
    text: &str,
    max_tokens: usize,
) -> Result<Collected> {
    s.serve(Request::turn(name, text, greedy(max_tokens)).with_priority(priority))
}

/// The blocks session `name`'s cache holds.
pub fn blocks_of(s: &Scheduler, name: &str) -> u32 {
    s.sessions()
        .iter()
        .find(|x| x.name == name)
        .map_or(0, |x| x.blocks)
}
