//! The eviction policy of §6.3 over random sets of sessions: the plan never touches a session in
//! the middle of a request or an interactive session used within the idle threshold; it goes
//! background → system → idle interactive, least recently used first within a level; each
//! session is truncated from its end (partial and reserved blocks first, then full blocks last
//! to first) before the next one is touched; and it can take back every block the evictable
//! sessions hold.

use std::collections::HashSet;
use std::time::Duration;

use airs_memory::eviction::{
    EvictionClass, EvictionPolicy, Priority, Protection, SessionDescriptor, SessionId,
};
use proptest::prelude::*;

const TPB: u32 = 16;

fn priority() -> impl Strategy<Value = Priority> {
    prop_oneof![
        Just(Priority::Interactive),
        Just(Priority::System),
        Just(Priority::Background)
    ]
}

/// (priority, seconds since last access, in request, full blocks, partial tokens, empty blocks)
fn descriptor() -> impl Strategy<Value = (Priority, u64, bool, u32, u32, u32)> {
    (
        priority(),
        0u64..1_000,
        prop::bool::weighted(0.15),
        0u32..6,
        0u32..TPB,
        0u32..3,
    )
}

fn build(raw: &[(Priority, u64, bool, u32, u32, u32)], now: u64) -> Vec<SessionDescriptor> {
    raw.iter()
        .enumerate()
        .map(|(i, &(priority, ago, in_request, full, partial, empty))| {
            let partial_block = u32::from(partial > 0);
            SessionDescriptor {
                id: SessionId(i as u64 * 7 + 3),
                priority,
                // Ties in last access are common: ids must break them.
                last_access: Duration::from_secs(now - ago / 10 * 10),
                in_request,
                blocks_held: full + partial_block + empty,
                full_blocks: full,
                partial_block_tokens: partial,
            }
        })
        .collect()
}

fn expected_class(
    d: &SessionDescriptor,
    now: Duration,
    threshold: Duration,
) -> Option<EvictionClass> {
    if d.in_request {
        return None;
    }
    match d.priority {
        Priority::Background => Some(EvictionClass::Background),
        Priority::System => Some(EvictionClass::System),
        Priority::Interactive => {
            (now - d.last_access > threshold).then_some(EvictionClass::IdleInteractive)
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_plan_follows_the_section_6_3_order(
        raw in prop::collection::vec(descriptor(), 0..12),
        threshold_s in prop_oneof![Just(0u64), Just(300), 0u64..1_000],
    ) {
        let now_s = 10_000;
        let now = Duration::from_secs(now_s);
        let threshold = Duration::from_secs(threshold_s);
        let sessions = build(&raw, now_s);
        let policy = EvictionPolicy { idle_threshold: threshold, tokens_per_block: TPB };
        let plan = policy.plan(&sessions, now);
        let by_id = |id: SessionId| sessions.iter().find(|d| d.id == id).unwrap();

        // Never a protected session; classes match the definition.
        for s in &plan.steps {
            let d = by_id(s.session);
            prop_assert!(!d.in_request, "evicted a session in request");
            prop_assert_eq!(Some(s.class), expected_class(d, now, threshold));
            if d.priority == Priority::Interactive {
                prop_assert!(now - d.last_access > threshold, "evicted an active interactive session");
            }
        }

        // Levels in order; within a level LRU (then id); each session's steps contiguous.
        let mut order = Vec::new();
        for s in &plan.steps {
            if order.last() != Some(&s.session) {
                prop_assert!(!order.contains(&s.session), "a session's steps are split");
                order.push(s.session);
            }
        }
        for w in order.windows(2) {
            let (a, b) = (by_id(w[0]), by_id(w[1]));
            let ka = (expected_class(a, now, threshold), a.last_access, a.id);
            let kb = (expected_class(b, now, threshold), b.last_access, b.id);
            prop_assert!(ka < kb, "{:?} before {:?}", ka, kb);
        }

        // Within a session: truncate from the end, partial (and reserved) blocks first.
        for &id in &order {
            let d = by_id(id);
            let steps: Vec<_> = plan.steps.iter().filter(|s| s.session == id).collect();
            let mut held = d.blocks_held;
            for (i, s) in steps.iter().enumerate() {
                prop_assert!(s.keep_blocks < held);
                prop_assert_eq!(s.freed_blocks, held - s.keep_blocks);
                if i == 0 && d.blocks_held > d.full_blocks {
                    prop_assert_eq!(s.keep_blocks, d.full_blocks);
                    prop_assert_eq!(s.recompute_tokens, u64::from(d.partial_block_tokens));
                } else {
                    prop_assert_eq!(s.freed_blocks, 1, "full blocks go one at a time");
                    prop_assert_eq!(s.recompute_tokens, u64::from(TPB));
                }
                held = s.keep_blocks;
            }
            prop_assert_eq!(held, 0, "an evictable session can be emptied");
        }

        // Every evictable session with blocks is in the plan, every other one is protected.
        let planned: HashSet<_> = order.iter().copied().collect();
        let protected: HashSet<_> = plan.protected.iter().map(|(id, _)| *id).collect();
        for d in sessions.iter().filter(|d| d.blocks_held > 0) {
            let evictable = expected_class(d, now, threshold).is_some();
            prop_assert_eq!(planned.contains(&d.id), evictable);
            prop_assert_eq!(protected.contains(&d.id), !evictable);
        }
        for (id, why) in &plan.protected {
            let d = by_id(*id);
            match why {
                Protection::InRequest => prop_assert!(d.in_request),
                Protection::ActiveInteractive { idle_for } => {
                    prop_assert!(!d.in_request && d.priority == Priority::Interactive);
                    prop_assert_eq!(*idle_for, now - d.last_access);
                }
            }
        }
        let evictable: u64 = sessions
            .iter()
            .filter(|d| expected_class(d, now, threshold).is_some())
            .map(|d| u64::from(d.blocks_held))
            .sum();
        prop_assert_eq!(plan.evictable_blocks(), evictable);

        // The shortest prefix that frees n blocks.
        for n in [0u64, 1, 3, evictable, evictable + 1] {
            let prefix = plan.prefix_for(n);
            let freed: u64 = prefix.iter().map(|s| u64::from(s.freed_blocks)).sum();
            if n <= evictable {
                prop_assert!(freed >= n);
                if let Some((last, rest)) = prefix.split_last() {
                    let before: u64 = rest.iter().map(|s| u64::from(s.freed_blocks)).sum();
                    prop_assert!(before < n || last.freed_blocks == 0);
                }
            } else {
                prop_assert_eq!(prefix.len(), plan.steps.len());
            }
        }
    }
}

#[test]
fn an_interactive_session_is_idle_only_strictly_past_the_threshold() {
    let policy = EvictionPolicy::new(TPB);
    let d = SessionDescriptor {
        id: SessionId(1),
        priority: Priority::Interactive,
        last_access: Duration::from_secs(100),
        in_request: false,
        blocks_held: 1,
        full_blocks: 1,
        partial_block_tokens: 0,
    };
    let at = |s| policy.classify(&d, Duration::from_secs(s));
    assert!(matches!(at(400), Err(Protection::ActiveInteractive { .. })));
    assert_eq!(at(401), Ok(EvictionClass::IdleInteractive));
    let busy = SessionDescriptor {
        in_request: true,
        priority: Priority::Background,
        ..d
    };
    assert_eq!(
        policy.classify(&busy, Duration::from_secs(10_000)),
        Err(Protection::InRequest)
    );
}
