//! Helpers shared by the runtime tests: stories260K engines and small managers.
#![allow(dead_code)]

use std::time::Duration;

use airs_memory::PinPolicy;
use airs_runtime::{
    Engine, HistoryStore, ManagerConfig, ManualClock, RequestOptions, SessionManager,
};

/// Positions per block in the tests: small, so short conversations span several blocks.
pub const TPB: u32 = 8;

pub fn engine() -> Engine {
    Engine::open(&airs_testdata::stories_path(), 1).expect("stories260K")
}

/// Bytes of one block of stories260K's f16 KV cache with `TPB` positions.
pub fn block_bytes(engine: &Engine) -> usize {
    let c = &engine.model.config;
    2 * c.layers * c.kv_heads * c.head_dim * 2 * TPB as usize
}

pub fn config(blocks: usize, engine: &Engine) -> ManagerConfig {
    let mut c = ManagerConfig::new(blocks * block_bytes(engine));
    c.tokens_per_block = TPB;
    c.pin = PinPolicy::None;
    c
}

/// A manager over an in-memory store with a pool of `blocks` blocks and a manual clock.
pub fn manager(blocks: usize, idle_threshold: Duration) -> (SessionManager, ManualClock) {
    let e = engine();
    let mut c = config(blocks, &e);
    c.idle_threshold = idle_threshold;
    let clock = ManualClock::new();
    let m = SessionManager::with_clock(
        e,
        HistoryStore::open_in_memory().unwrap(),
        c,
        Box::new(clock.clone()),
    )
    .unwrap();
    (m, clock)
}

pub fn opts(max_tokens: usize) -> RequestOptions {
    RequestOptions { max_tokens }
}
