//! The real Qwen2.5-Coder-0.5B (Q4_K_M, ChatML template): a short workload overflowing a pool of
//! a few blocks evicts and rebuilds sessions, and every reply equals the reply of a run that
//! never evicts, whichever schedule the kernels call for.
use airs_memory::PinPolicy;
use airs_runtime::workload::{BenchConfig, Workload, run_bench};
use airs_runtime::{Engine, RebuildMode};

#[test]
fn qwen_sessions_rebuild_to_identical_replies() {
    let path = airs_testdata::qwen_path();
    let w = Workload::from_json(
        r#"{
        "name": "qwen-tiny", "max_tokens": 4, "step_seconds": 400,
        "sessions": [
          {"name": "chat", "priority": "interactive", "steps": [0, 2], "turns": ["Hi!", "Say it again."]},
          {"name": "svc", "priority": "system", "system": "Answer yes or no.", "steps": [0, 1],
           "turns": ["Is the sky blue?", "Is fire cold?"]},
          {"name": "bg", "priority": "background", "steps": [1, 2],
           "turns": ["Summarize: apples are red.", "Summarize: the sea is deep."]}
        ]}"#,
    )
    .unwrap();
    // The schedule the kernels call for, and block-aligned replay (what f32 models and CPUs
    // without batch-invariant kernels use) on the same model.
    for mode in [RebuildMode::Auto, RebuildMode::Replay] {
        let mut c = BenchConfig::new(7 * 196_608);
        c.pin = PinPolicy::None;
        c.verify = true;
        c.rebuild = mode;
        c.reference_pool_bytes = Some(64 << 20);
        let report = run_bench(
            Engine::open(&path, 2).unwrap(),
            Some(Engine::open(&path, 2).unwrap()),
            &c,
            &w,
        )
        .unwrap();
        println!("{report}");
        assert!(report.ok(), "{report}");
        assert_eq!(report.failed_requests, 0, "{report}");
        assert!(report.rebuilds > 0, "{report}");
        assert_eq!(
            report.verification.as_ref().unwrap().identical,
            report.requests
        );
    }
}
