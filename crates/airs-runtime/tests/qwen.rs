//! The real Qwen2.5-Coder-0.5B (Q4_K_M, ChatML template): a short workload overflowing a pool of
//! a few blocks evicts and rebuilds sessions (the turns of a time step served together), and
//! every reply equals the reply of a run that never evicts.
use std::sync::Arc;

use airs_memory::PinPolicy;
use airs_runtime::LoadedModel;
use airs_runtime::workload::{BenchConfig, Workload, run_bench};

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
    let mut c = BenchConfig::new(7 * 196_608);
    c.pin = PinPolicy::None;
    c.verify = true;
    c.reference_pool_bytes = Some(64 << 20);
    let model = Arc::new(LoadedModel::open(&path, 2).unwrap());
    let reference = Arc::new(LoadedModel::open(&path, 2).unwrap());
    let report = run_bench(&model, Some(&reference), &c, &w).unwrap();
    println!("{report}");
    assert!(report.ok(), "{report}");
    assert_eq!(report.failed_requests, 0, "{report}");
    assert!(report.rebuilt_tokens > 0, "{report}");
    assert_eq!(
        report.verification.as_ref().unwrap().identical,
        report.requests
    );
}
