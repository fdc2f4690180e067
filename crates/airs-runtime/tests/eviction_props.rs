//! The scheduler under random session workloads on stories260K with a small pool (the turns of
//! a time step served together), every step checked against §6.3: the pool budget is never exceeded, an active interactive session (or
//! the session being served) is never evicted, evictions go background → system → idle
//! interactive, least recently used first — and every reply, including those of sessions whose
//! caches were evicted and rebuilt, equals the reply of the same workload served by a pool that
//! never evicts and decodes one token a step (greedy and seeded sampling alike, with and without
//! speculative decoding).
mod common;

use airs_memory::PinPolicy;
use airs_runtime::DraftConfig;
use airs_runtime::workload::{BenchConfig, Workload, WorkloadSession, run_bench};
use common::*;
use proptest::prelude::*;

const TEXTS: [&str; 8] = [
    "Once upon a time there was a little cat.",
    "The dog ran to the park.",
    "Lily wanted to play with her red ball.",
    "What happened next?",
    "Tom saw a big tree and a bird.",
    "Mom said: be careful!",
    "They were happy.",
    "The sun was hot and the sky was blue.",
];
const SYSTEMS: [&str; 2] = [
    "You tell short stories for children. Every story is kind and has a happy end.",
    "You answer with one sentence.",
];

/// (priority, system prompt, hot sampling, seed, turn texts, steps, max tokens)
type RawSession = (
    u8,
    Option<usize>,
    bool,
    u64,
    Vec<usize>,
    Vec<usize>,
    Option<usize>,
);

fn session() -> impl Strategy<Value = RawSession> {
    (
        0u8..3,
        prop::option::of(0usize..2),
        prop::bool::weighted(0.3),
        0u64..4,
        prop::collection::vec(0usize..TEXTS.len(), 2..5),
        prop::collection::btree_set(0usize..12, 4).prop_map(|s| s.into_iter().collect()),
        prop::option::weighted(0.3, 2usize..10),
    )
}

fn workload(
    sessions: Vec<RawSession>,
    max_tokens: usize,
    step_seconds: f64,
    idle_threshold_seconds: f64,
) -> Workload {
    let priorities = ["interactive", "system", "background"];
    Workload {
        name: "random".into(),
        max_tokens,
        step_seconds,
        idle_threshold_seconds,
        sessions: sessions
            .into_iter()
            .enumerate()
            .map(
                |(i, (p, sys, hot, seed, turns, steps, max))| WorkloadSession {
                    name: format!("s{i}"),
                    priority: priorities[p as usize].into(),
                    system: sys.map(|k| SYSTEMS[k].to_string()),
                    salt: None,
                    steps: Some(steps),
                    start: 0,
                    every: 1,
                    max_tokens: max,
                    temperature: if hot { 0.9 } else { 0.0 },
                    seed,
                    turns: turns.into_iter().map(|t| TEXTS[t].to_string()).collect(),
                },
            )
            .collect(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_workloads_keep_the_invariants_and_rebuild_exactly(
        sessions in prop::collection::vec(session(), 2..6),
        max_tokens in 2usize..12,
        step_seconds in prop_oneof![Just(0.0), Just(30.0), Just(100.0), Just(200.0)],
        idle in prop_oneof![Just(0.0), Just(60.0), Just(300.0)],
        blocks in 10usize..36,
        draft_tokens in prop_oneof![Just(0usize), Just(4usize)],
    ) {
        let w = workload(sessions, max_tokens, step_seconds, idle);
        let m = model();
        let mut c = BenchConfig::new(blocks * block_bytes(&m));
        c.tokens_per_block = TPB;
        c.pin = PinPolicy::None;
        c.verify = true;
        c.reference_pool_bytes = Some(4 << 20);
        c.draft = DraftConfig::with_tokens(draft_tokens).free();
        let report = run_bench(&m, Some(&model()), &c, &w).unwrap();
        prop_assert!(report.violations.is_empty(), "{:?}", report.violations);
        let v = report.verification.as_ref().unwrap();
        prop_assert_eq!(v.reference_evictions, 0);
        prop_assert!(v.mismatches.is_empty(), "{}", report);
        prop_assert!(report.peak_used_bytes <= report.pool_bytes);
        for t in report.turns.iter().filter(|t| t.error.is_some()) {
            prop_assert!(t.error.as_ref().unwrap().contains("KV pool exhausted"));
        }
    }
}
