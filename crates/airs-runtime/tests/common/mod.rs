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

/// `airs_runtime::perplexity`'s evaluation of `model` over the design chapter
/// (`testdata/text/model-memory.md`) in `chunks` chunks of `ctx` tokens with `kv_type` KV,
/// against `testdata/reference/{stem}.json`; printed, and checked for what every quality gate
/// shares: the reference's tokenization equals airs's, the chunks and scored positions, the
/// reference perplexity as the file gives it, and for a trained model airs's perplexity within
/// 1% of the reference's (a random model's perplexity of real text rests on log-probabilities
/// near −40 and says nothing). Returns the divergence for the gate's own targets.
pub fn design_text_divergence(
    model: &LoadedModel,
    stem: &str,
    ctx: usize,
    chunks: usize,
    kv_type: airs_engine::KvType,
    trained: bool,
) -> airs_runtime::perplexity::KldStats {
    use airs_runtime::perplexity::{KldReference, PerplexityConfig, evaluate, tokenize};
    let text =
        std::fs::read_to_string(airs_testdata::repo_path("testdata/text/model-memory.md")).unwrap();
    let tokens = tokenize(model, &text);
    let bytes = std::fs::read(airs_testdata::repo_path(&format!(
        "testdata/reference/{stem}.json"
    )))
    .unwrap();
    let reference = KldReference::parse(&bytes).unwrap();
    assert_eq!(reference.text_token_ids, tokens, "{stem}: tokenization");
    let config = PerplexityConfig::new(ctx, kv_type);
    let r = evaluate(model, &tokens, &config, Some(&reference), &mut |_, _| {}).unwrap();
    let k = r.kld.clone().unwrap();
    eprintln!(
        "{stem}: perplexity {:.4} (reference {:.4}), KLD mean {:.6} median {:.6} p99 {:.6} \
         max {:.6}, top-1 {:.2}%, mean |dp| {:.5}, {:.0} tokens/s",
        r.perplexity,
        k.reference_perplexity,
        k.mean,
        k.median,
        k.p99,
        k.max,
        k.top1_agreement * 100.0,
        k.mean_abs_dp,
        r.tokens_per_s
    );
    assert_eq!(
        (r.chunks, r.positions),
        (chunks, chunks * (ctx / 2 - 1)),
        "{stem}"
    );
    assert!((k.reference_perplexity - reference.perplexity(chunks)).abs() < 1e-9);
    let ratio = r.perplexity / k.reference_perplexity;
    assert!(
        !trained || (ratio - 1.0).abs() <= 0.01,
        "{stem}: perplexity ratio {ratio}"
    );
    k
}
