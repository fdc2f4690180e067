//! When only active interactive sessions hold the pool, a request that needs more fails with
//! `PoolExhausted` naming them (priorities, bytes, why they were kept) and evicts nobody; once
//! they go idle, the same request succeeds by evicting them.
mod common;

use std::time::Duration;

use airs_runtime::{CacheState, Priority, Protection, RuntimeEvent, SessionSpec};
use common::*;

#[test]
fn only_active_interactive_holders_means_pool_exhausted_naming_them() {
    let (mut m, clock) = manager(15, Duration::from_secs(300));
    let alice = m
        .open_session(&SessionSpec::new("alice", Priority::Interactive))
        .unwrap();
    let bob = m
        .open_session(&SessionSpec::new("bob", Priority::Interactive))
        .unwrap();
    m.request(
        alice,
        "Once upon a time there was a big red ball.",
        &opts(20),
    )
    .unwrap();
    m.request(
        bob,
        "Lily went to the park with her mom and dad.",
        &opts(20),
    )
    .unwrap();
    clock.advance(Duration::from_secs(60));
    let carol = m
        .open_session(&SessionSpec::new("carol", Priority::Background))
        .unwrap();
    let before: Vec<_> = m
        .sessions()
        .into_iter()
        .map(|s| (s.name, s.blocks))
        .collect();
    let err = m
        .request(
            carol,
            "Tom had a little dog that liked to run in the garden.",
            &opts(20),
        )
        .unwrap_err();
    let report = err.pool_exhausted().expect("a PoolExhausted error").clone();
    let text = err.to_string();
    assert!(text.contains("KV pool exhausted"), "{text}");
    for name in ["alice", "bob"] {
        let h = report.holders.iter().find(|h| h.name == name).expect(name);
        assert_eq!(h.priority, Priority::Interactive);
        assert!(h.blocks > 0 && h.bytes == h.blocks as usize * m.pool().block_bytes());
        assert!(matches!(
            h.protection,
            Some(Protection::ActiveInteractive { .. })
        ));
        assert!(
            text.contains(&format!(
                "\"{name}\" (interactive, {} blocks = {} bytes, active",
                h.blocks, h.bytes
            )),
            "{text}"
        );
    }
    assert_eq!(report.session_name, "carol");
    assert_eq!(report.evictable_blocks, 0);
    // Nobody was evicted, and the failed turn left no trace.
    let after: Vec<_> = m
        .sessions()
        .into_iter()
        .map(|s| (s.name, s.blocks))
        .collect();
    assert_eq!(
        before
            .iter()
            .filter(|(n, _)| n != "carol")
            .collect::<Vec<_>>(),
        after
            .iter()
            .filter(|(n, _)| n != "carol")
            .collect::<Vec<_>>()
    );
    let events = m.take_events();
    assert!(
        events
            .iter()
            .all(|e| !matches!(e, RuntimeEvent::Evicted(_)))
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, RuntimeEvent::Exhausted(_)))
    );
    assert!(m.history(carol).unwrap().is_empty());
    assert_eq!(m.stats().exhausted_requests, 1);

    // Five minutes later alice and bob are idle: the request evicts them (least recently used
    // first) and succeeds; both rebuild to what they would have said anyway.
    clock.advance(Duration::from_secs(301));
    // Idleness comes from the runtime's own record of KV accesses; DAMON is only reported.
    let infos = m.sessions();
    for name in ["alice", "bob"] {
        let info = infos.iter().find(|s| s.name == name).unwrap();
        assert_eq!(info.state, CacheState::Idle, "{name}");
        assert!(info.kv_accesses > 0 && info.blocks > 0);
    }
    let stats = m.stats();
    assert_eq!(
        stats.idle_sessions, 3,
        "alice, bob, and carol who never got a cache"
    );
    assert_eq!(
        stats.damon_available,
        std::path::Path::new(airs_runtime::idle::DAMON_ADMIN_PATH).exists()
    );
    m.request(
        carol,
        "Tom had a little dog that liked to run in the garden.",
        &opts(20),
    )
    .unwrap();
    let evicted: Vec<String> = m
        .take_events()
        .into_iter()
        .filter_map(|e| match e {
            RuntimeEvent::Evicted(e) => Some(e),
            _ => None,
        })
        .map(|e| {
            airs_runtime::invariants::check_eviction(&e, Duration::from_secs(300)).unwrap();
            m.sessions()
                .into_iter()
                .find(|s| s.id == e.step.session)
                .unwrap()
                .name
        })
        .collect();
    assert_eq!(evicted.first().map(String::as_str), Some("alice"));
}

#[test]
fn a_request_larger_than_the_pool_fails_cleanly() {
    let (mut m, _clock) = manager(2, Duration::from_secs(300));
    let s = m
        .open_session(&SessionSpec::new("big", Priority::Background))
        .unwrap();
    let err = m
        .request(
            s,
            "One day, a little girl named Lily found a needle in her room.",
            &opts(30),
        )
        .unwrap_err();
    let report = err.pool_exhausted().expect("PoolExhausted");
    assert!(report.holders.is_empty(), "nobody holds memory: {err}");
    assert!(report.pool.needed_blocks > report.pool.blocks_total);
    assert!(err.to_string().contains("memory is held by no session"));
    assert_eq!(
        m.sessions()[0].blocks,
        0,
        "the failed request released its blocks"
    );
    m.pool().memory().audit().unwrap();
}

/// Regression: a background session whose prompt blocks are shared with an active interactive
/// session frees only its own blocks when evicted. The manager must count that before evicting:
/// a reservation the pool cannot serve even after evicting it fails with nothing evicted, never
/// after dropping the shared blocks for nothing (an eviction step that frees no block). Swept
/// over reply lengths so that some requests fit and some miss by the shared blocks.
#[test]
fn shared_prefix_blocks_are_not_counted_as_freeable_before_evicting() {
    let prompt = "Once upon a time there was a big red ball in the garden of a little house.";
    let (mut failed, mut evicted_and_served) = (0, 0);
    for max_tokens in (4..=72).step_by(4) {
        let (mut m, clock) = manager(14, Duration::from_secs(300));
        let alice = m
            .open_session(&SessionSpec::new("alice", Priority::Interactive))
            .unwrap();
        let bg = m
            .open_session(&SessionSpec::new("bg", Priority::Background))
            .unwrap();
        m.request(alice, prompt, &opts(16)).unwrap();
        // bg shares alice's prompt blocks, then goes its own way.
        let bg_prompt = format!("{prompt} Then a dog came and took the ball to the park.");
        m.request(bg, &bg_prompt, &opts(16)).unwrap();
        let used = m.pool().stats().blocks_used;
        let held: u32 = m.sessions().iter().map(|s| s.blocks).sum();
        assert!(
            held > used,
            "the two sessions share prompt blocks ({held} refs, {used} blocks)"
        );
        clock.advance(Duration::from_secs(1));
        m.take_events();
        let bg_blocks = |m: &airs_runtime::SessionManager| {
            m.sessions().iter().find(|s| s.name == "bg").unwrap().blocks
        };
        let bg_before = bg_blocks(&m);
        let carol = m
            .open_session(&SessionSpec::new("carol", Priority::Interactive))
            .unwrap();
        let result = m.request(
            carol,
            "Tom had a little dog that liked to run and jump in the sun.",
            &opts(max_tokens),
        );
        let mut evictions = 0;
        for e in m.take_events() {
            if let RuntimeEvent::Evicted(e) = e {
                evictions += 1;
                assert!(
                    e.pool_blocks_freed > 0,
                    "max_tokens {max_tokens}: an eviction step freed nothing: {e:?}"
                );
            }
        }
        match result {
            Ok(_) => evicted_and_served += usize::from(evictions > 0),
            Err(e) => {
                assert!(e.pool_exhausted().is_some(), "{e}");
                // bg kept at least the blocks it shares with alice.
                assert!(
                    bg_blocks(&m) >= bg_before.min(held - used),
                    "max_tokens {max_tokens}"
                );
                failed += 1;
            }
        }
    }
    assert!(
        failed > 0 && evicted_and_served > 0,
        "{failed} failed, {evicted_and_served} evicted"
    );
}
