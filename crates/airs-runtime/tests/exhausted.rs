//! When only active interactive sessions hold the pool, a request that needs more fails with
//! `PoolExhausted` naming them (priorities, bytes, why they were kept) and evicts nobody; once
//! they go idle, the same request succeeds by evicting them.
mod common;

use std::time::Duration;

use airs_runtime::{Priority, Protection, SchedulerEvent};
use common::*;

#[test]
fn only_active_interactive_holders_means_pool_exhausted_naming_them() {
    let (mut s, clock) = scheduler(15, Duration::from_secs(300));
    let i = Priority::Interactive;
    turn(
        &mut s,
        "alice",
        i,
        "Once upon a time there was a big red ball.",
        20,
    )
    .unwrap();
    turn(
        &mut s,
        "bob",
        i,
        "Lily went to the park with her mom and dad.",
        20,
    )
    .unwrap();
    clock.advance(Duration::from_secs(60));
    let before: Vec<_> = s
        .sessions()
        .into_iter()
        .map(|x| (x.name, x.blocks))
        .collect();
    s.take_events();
    let carol = "Tom had a little dog that liked to run in the garden.";
    let err = turn(&mut s, "carol", Priority::Background, carol, 20).unwrap_err();
    let report = err.pool_exhausted().expect("a PoolExhausted error").clone();
    let text = err.to_string();
    assert!(text.contains("KV pool exhausted"), "{text}");
    let block_bytes = s.kv_pool().block_bytes();
    for name in ["alice", "bob"] {
        let h = report.holders.iter().find(|h| h.name == name).expect(name);
        assert_eq!(h.priority, Priority::Interactive);
        assert!(h.blocks > 0 && h.bytes == h.blocks as usize * block_bytes);
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
    assert_eq!(report.requester, "session \"carol\"");
    assert_eq!(report.evictable_blocks, 0);
    // Nobody was evicted, and the failed turn left no trace.
    let after: Vec<_> = s
        .sessions()
        .into_iter()
        .map(|x| (x.name, x.blocks))
        .collect();
    let others = |v: &[(String, u32)]| -> Vec<(String, u32)> {
        v.iter().filter(|(n, _)| n != "carol").cloned().collect()
    };
    assert_eq!(others(&before), others(&after));
    let events = s.take_events();
    assert!(
        events
            .iter()
            .all(|e| !matches!(e, SchedulerEvent::CacheEvicted { .. })),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, SchedulerEvent::Exhausted(_)))
    );
    assert!(s.history("carol").unwrap().is_empty());
    assert_eq!(s.stats().exhausted, 1);

    // Five minutes later alice and bob are idle: the request evicts them (least recently used
    // first) and succeeds.
    clock.advance(Duration::from_secs(301));
    // Idleness comes from the runtime's own record of KV accesses; DAMON is only reported.
    for name in ["alice", "bob"] {
        let info = s.sessions().into_iter().find(|x| x.name == name).unwrap();
        assert!(info.idle && info.blocks > 0, "{name}");
    }
    turn(&mut s, "carol", Priority::Background, carol, 20).unwrap();
    let evicted: Vec<String> = s
        .take_events()
        .into_iter()
        .filter(|e| matches!(e, SchedulerEvent::CacheEvicted { .. }))
        .map(|e| {
            airs_runtime::invariants::check_event(&e, Duration::from_secs(300)).unwrap();
            let SchedulerEvent::CacheEvicted {
                caches, session, ..
            } = e
            else {
                unreachable!()
            };
            assert!(caches.iter().any(|c| c.0 == session));
            s.sessions()
                .into_iter()
                .find(|x| x.id == session.0)
                .map(|x| x.name)
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(evicted.first().map(String::as_str), Some("alice"));
}

#[test]
fn a_request_larger_than_the_pool_fails_cleanly() {
    let (mut s, _clock) = scheduler(2, Duration::from_secs(300));
    let text = "One day, a little girl named Lily found a needle in her room.";
    let err = turn(&mut s, "big", Priority::Background, text, 30).unwrap_err();
    let report = err.pool_exhausted().expect("PoolExhausted");
    assert!(
        report.holders.iter().all(|h| h.name == "big"),
        "nobody else holds memory: {err}"
    );
    assert!(report.pool.needed_blocks + report.pool.available_blocks > report.pool.blocks_total);
    // Larger than the whole pool: the request's fault, never to be retried.
    let too_small = report.exceeds_pool.expect("named as larger than the pool");
    assert!(
        too_small.needed_tokens > too_small.pool_tokens,
        "{too_small:?}"
    );
    assert_eq!(err.class(), airs_runtime::ErrorClass::BadRequest);
    assert_eq!(
        blocks_of(&s, "big"),
        0,
        "the failed request released its blocks"
    );
    let audit = s.kv_pool().memory().audit().unwrap();
    assert_eq!(audit.blocks_used, 0);
}

/// Regression: a background session whose prompt blocks are shared with an active interactive
/// session frees only its own blocks when evicted. The scheduler must count that before
/// evicting: a reservation the pool cannot serve even after evicting it fails with nothing
/// evicted, never after dropping the shared blocks for nothing (an eviction step that frees no
/// block). Swept over reply lengths so that some requests fit and some miss by the shared
/// blocks.
#[test]
fn shared_prefix_blocks_are_not_counted_as_freeable_before_evicting() {
    let prompt = "Once upon a time there was a big red ball in the garden of a little house.";
    let (mut failed, mut evicted_and_served) = (0, 0);
    for max_tokens in (4..=72).step_by(4) {
        let (mut s, clock) = scheduler(14, Duration::from_secs(300));
        turn(&mut s, "alice", Priority::Interactive, prompt, 16).unwrap();
        // bg shares alice's prompt blocks, then goes its own way.
        let bg_prompt = format!("{prompt} Then a dog came and took the ball to the park.");
        turn(&mut s, "bg", Priority::Background, &bg_prompt, 16).unwrap();
        let used = s.kv_pool().stats().blocks_used;
        let held: u32 = s.sessions().iter().map(|x| x.blocks).sum();
        assert!(
            held > used,
            "the two sessions share prompt blocks ({held} refs, {used} blocks)"
        );
        clock.advance(Duration::from_secs(1));
        s.take_events();
        let bg_before = blocks_of(&s, "bg");
        let result = turn(
            &mut s,
            "carol",
            Priority::Interactive,
            "Tom had a little dog that liked to run and jump in the sun.",
            max_tokens,
        );
        let mut evictions = 0;
        for e in s.take_events() {
            if let SchedulerEvent::CacheEvicted { blocks_freed, .. } = &e {
                evictions += 1;
                assert!(
                    *blocks_freed > 0,
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
                    blocks_of(&s, "bg") >= bg_before.min(held - used),
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

/// A sequence alone in the pool that generates past what the pool holds ends like one that
/// reaches the context length (`length` for OpenAI): its text is kept, it is the text the
/// same request writes with room to spare, cut where the pool ran out; and the blocks go back.
#[test]
fn a_lone_sequence_that_outgrows_the_pool_ends_with_its_text() {
    use airs_runtime::{FinishReason, Prompt, Request, Scheduler};
    let model = model();
    let prompt = Prompt::Text("Once upon a time".into());
    let mut params = greedy(100);
    params.ignore_eos = true;
    let mut roomy = Scheduler::new(model.clone(), config(64, &model), None).unwrap();
    let full = roomy
        .serve(Request::generate(prompt.clone(), params.clone()))
        .unwrap();
    assert_eq!(full.choices[0].reason, FinishReason::MaxTokens);
    for priority in [Priority::Interactive, Priority::Background] {
        let mut s = Scheduler::new(model.clone(), config(4, &model), None).unwrap();
        let c = s
            .serve(Request::generate(prompt.clone(), params.clone()).with_priority(priority))
            .unwrap();
        let (prompt_tokens, _) = c.admitted.unwrap();
        let end = &c.choices[0];
        assert_eq!(end.reason, FinishReason::ContextFull, "{priority:?}");
        // Four blocks of TPB positions; the last token drawn is not computed.
        assert_eq!(
            end.tokens.len(),
            4 * TPB as usize - prompt_tokens + 1,
            "{priority:?}"
        );
        assert_eq!(end.tokens[..], full.choices[0].tokens[..end.tokens.len()]);
        assert!(full.choices[0].text.starts_with(&end.text));
        assert_eq!(s.kv_pool().memory().audit().unwrap().blocks_used, 0);
    }
}
