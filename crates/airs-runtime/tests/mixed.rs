//! The `mixed` preset of `airs bench sessions` on stories260K with a pool it overflows: every
//! priority level is evicted, in order, the always-active interactive session never is, the one
//! that went idle is evicted and rebuilt, and every reply equals the never-evicting run's.
use std::sync::Arc;

use airs_memory::PinPolicy;
use airs_runtime::LoadedModel;
use airs_runtime::workload::{BenchConfig, Workload, run_bench};

#[test]
fn the_mixed_preset_evicts_by_priority_and_rebuilds_exactly() {
    let path = airs_testdata::stories_path();
    let mut c = BenchConfig::new(384 << 10);
    c.pin = PinPolicy::None;
    c.verify = true;
    let w = Workload::preset("mixed").unwrap();
    let model = Arc::new(LoadedModel::open(&path, 1).unwrap());
    let reference = Arc::new(LoadedModel::open(&path, 1).unwrap());
    let report = run_bench(&model, Some(&reference), &c, &w).unwrap();
    assert!(report.ok(), "{report}");
    assert_eq!(report.failed_requests, 0, "{report}");
    assert_eq!(report.requests, w.schedule().len());
    let e = &report.evictions;
    assert!(
        e.background > 0 && e.system > 0 && e.interactive > 0,
        "{report}"
    );
    assert!(report.rebuilt_tokens > 0);
    assert!(
        report.prefix_hit_tokens > 0,
        "svc-2 shares svc-1's system prompt"
    );
    // The always-active interactive session is never evicted: its turns recompute nothing.
    assert!(
        report
            .turns
            .iter()
            .filter(|t| t.session == "chat-2")
            .all(|t| t.recomputed_tokens == 0 && t.preemptions == 0),
        "{report}"
    );
    let last = report
        .turns
        .iter()
        .rev()
        .find(|t| t.session == "chat-1")
        .unwrap();
    assert!(
        last.recomputed_tokens > 0,
        "chat-1 came back after going idle: {report}"
    );
    let v = report.verification.as_ref().unwrap();
    assert_eq!(v.identical, report.requests);
    // The JSON report carries the same numbers.
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["evictions"]["system"], e.system);
}

#[test]
fn workload_files_parse_and_schedule() {
    let w = Workload::from_json(
        r#"{"sessions": [
            {"name": "a", "priority": "interactive", "steps": [0, 3], "turns": ["x", "y"]},
            {"name": "b", "priority": "background", "start": 1, "every": 2, "turns": ["p", "q"]}
        ]}"#,
    )
    .unwrap();
    assert_eq!(w.max_tokens, 16);
    let s: Vec<(usize, usize, usize)> = w
        .schedule()
        .iter()
        .map(|t| (t.step, t.session, t.turn))
        .collect();
    assert_eq!(s, [(0, 0, 0), (1, 1, 0), (3, 0, 1), (3, 1, 1)]);
    assert!(
        Workload::from_json(r#"{"sessions": [{"name": "a", "priority": "urgent", "turns": []}]}"#)
            .is_err()
    );
    assert!(Workload::from_json(r#"{"sessions": [], "extra": 1}"#).is_err());
    let backwards = r#"{"sessions": [{"name": "a", "priority": "system", "steps": [3, 1],
                        "turns": ["x", "y"]}]}"#;
    assert!(Workload::from_json(backwards).is_err());
    assert!(Workload::load("no-such-preset-or-file").is_err());
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/workloads/short.json");
    assert_eq!(Workload::load(example).unwrap().sessions.len(), 7);
}
