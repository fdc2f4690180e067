//! Speculative decoding with prompt-lookup drafts ([`airs_runtime::lookup`]) changes how fast
//! tokens come, never which: on real models, replies with drafts equal replies decoded one
//! token a step — greedy and sampled, with stop strings, log-probabilities, several choices, a
//! JSON constraint, across session turns and beside other requests — while the drafts that
//! are kept save steps, and every block a rejected draft took goes back to the pool.
mod common;

use std::sync::Arc;

use airs_engine::SamplerConfig;
use airs_runtime::{
    ChoiceEnd, Collected, DraftConfig, DraftCost, GenerationParams, LoadedModel, OutputFormat,
    Priority, Prompt, Request, Scheduler, SchedulerConfig, TokenEvent,
};
use airs_tokenizer::chat::ChatMessage;

/// What a reply is made of: each choice's streamed tokens (id, text, log-probabilities) in
/// order, and its end. (Choices interleave differently: a step may give one several tokens.)
fn reply(c: &Collected) -> Vec<(Vec<String>, String)> {
    c.choices
        .iter()
        .map(|end: &ChoiceEnd| {
            let tokens = c
                .tokens
                .iter()
                .filter(|t: &&TokenEvent| t.choice == end.choice);
            (
                tokens.map(|t| format!("{t:?}")).collect(),
                format!("{end:?}"),
            )
        })
        .collect()
}

/// Submit `requests` at once and run them to completion: what each collected.
fn serve_together(s: &mut Scheduler, requests: impl Iterator<Item = Request>) -> Vec<Collected> {
    let cells: Vec<_> = requests
        .map(|request| {
            let (sink, cell) = Collected::sink();
            s.submit(request, sink).unwrap();
            cell
        })
        .collect();
    s.run_to_completion();
    cells
        .iter()
        .map(|c| std::mem::take(&mut *c.lock().unwrap()))
        .collect()
}

fn chat(text: &str) -> Prompt {
    Prompt::Chat(vec![ChatMessage::user(text)])
}

const RENAME: &str = "Rename the variable `total` to `sum` in this function and give the whole \
function back:\n```python\ndef average(values):\n    total = 0\n    for v in values:\n        \
total += v\n    if not values:\n        return 0\n    return total / len(values)\n```";

#[test]
fn qwen_replies_with_drafts_are_the_replies_of_decoding_one_token_a_step() {
    let model = Arc::new(LoadedModel::open(&airs_testdata::qwen_path(), 2).unwrap());
    let plain = SchedulerConfig::new(64 << 20);
    let drafting = SchedulerConfig {
        draft: DraftConfig::with_tokens(6),
        ..plain.clone()
    };
    let mut one = Scheduler::new(Arc::clone(&model), plain, None).unwrap();
    let mut spec = Scheduler::new(Arc::clone(&model), drafting, None).unwrap();

    let greedy = GenerationParams {
        max_tokens: 96,
        ..GenerationParams::default()
    };
    let sampled = GenerationParams {
        sampler: SamplerConfig {
            temperature: 0.7,
            top_p: 0.9,
            repeat_penalty: 1.1,
            seed: 7,
            ..SamplerConfig::default()
        },
        logprobs: Some(3),
        n: 2,
        ..greedy.clone()
    };
    let stopped = GenerationParams {
        stop: vec!["/ len".into()],
        ..greedy.clone()
    };
    let cases = [
        (RENAME, &greedy),
        (RENAME, &sampled),
        (RENAME, &stopped),
        (
            "Repeat exactly, twice: the quick brown fox jumps over the lazy dog.",
            &greedy,
        ),
        ("Why is the sky blue? One sentence.", &sampled),
    ];
    for (text, params) in cases {
        let (steps_one, steps_spec) = (one.stats().steps, spec.stats().steps);
        let want = one
            .serve(Request::generate(chat(text), params.clone()))
            .unwrap();
        let got = spec
            .serve(Request::generate(chat(text), params.clone()))
            .unwrap();
        assert_eq!(reply(&got), reply(&want), "{text:?} {params:?}");
        eprintln!(
            "{:?}: {} tokens in {} steps, {} with drafts",
            &text[..20],
            want.tokens.len(),
            one.stats().steps - steps_one,
            spec.stats().steps - steps_spec
        );
    }
    // The rename copies most of its prompt: drafts were kept and saved steps.
    let stats = spec.stats();
    assert!(stats.drafts_accepted > 0, "{stats:?}");
    assert!(
        stats.generated_tokens > stats.steps + stats.drafts_accepted / 2,
        "{stats:?}"
    );
    assert_eq!(stats.generated_tokens, one.stats().generated_tokens);
    assert!(stats.steps < one.stats().steps, "{stats:?}");
    // Every block a rejected draft took is back (only the prefix index's cache holds any).
    let audit = spec.kv_pool().memory().audit().unwrap();
    assert_eq!(audit.blocks_used, 0, "{audit:?}");
}

fn stories() -> Arc<LoadedModel> {
    common::model()
}

fn with_drafts(config: SchedulerConfig, tokens: usize) -> SchedulerConfig {
    SchedulerConfig {
        draft: DraftConfig::with_tokens(tokens).free(),
        ..config
    }
}

#[test]
fn session_turns_with_drafts_equal_turns_without_and_keep_a_consistent_cache() {
    let m = stories();
    let store = || Some(airs_runtime::HistoryStore::open_in_memory().unwrap());
    let mut one = Scheduler::new(Arc::clone(&m), common::config(64, &m), store()).unwrap();
    let mut spec = Scheduler::new(
        Arc::clone(&m),
        with_drafts(common::config(64, &m), 4),
        store(),
    )
    .unwrap();
    let turns = [
        "Once upon a time there was a girl named Lily.",
        "Lily went to the park with her mom.",
        "Then Lily saw a big dog.",
    ];
    for (i, text) in turns.iter().enumerate() {
        // Stop mid-story on some turns: the cache must hold exactly what the history holds.
        let params = GenerationParams {
            max_tokens: 24 + 10 * i,
            stop: if i == 1 { vec![".".into()] } else { Vec::new() },
            ..common::greedy(0)
        };
        let turn = || Request::turn("story", text, params.clone());
        let want = one.serve(turn()).unwrap();
        let got = spec.serve(turn()).unwrap();
        assert_eq!(reply(&got), reply(&want), "turn {i}");
        let (a, b) = (&one.sessions()[0], &spec.sessions()[0]);
        assert!(b.computed_tokens <= b.sequence_tokens, "{b:?}");
        assert!(b.cached_tokens <= b.sequence_tokens, "{b:?}");
        assert_eq!(a.sequence_tokens, b.sequence_tokens);
    }
    assert_eq!(one.history("story"), spec.history("story"));
    assert!(spec.stats().drafts_accepted > 0, "{:?}", spec.stats());
    airs_runtime::invariants::check_pool(spec.kv_pool().memory()).unwrap();
}

#[test]
fn drafts_change_nothing_beside_other_requests_under_a_constraint_or_in_a_small_pool() {
    let m = stories();
    let texts = [
        "Once upon a time there was a little cat who liked milk.",
        "The dog ran to the park. The dog ran to the park.",
        "Tom saw a big tree and a bird in it.",
        "Mom said: be careful!",
        "The sun was hot and the sky was blue.",
        "Lily wanted to play with her red ball.",
    ];
    let request = |i: usize| {
        let params = GenerationParams {
            max_tokens: 40 + i,
            format: if i == 3 {
                OutputFormat::JsonObject
            } else {
                OutputFormat::Text
            },
            sampler: SamplerConfig {
                temperature: if i % 2 == 1 { 0.8 } else { 0.0 },
                seed: i as u64,
                ..SamplerConfig::default()
            },
            ..GenerationParams::default()
        };
        // One interactive request: two could hold the small pool between them, and neither
        // is ever preempted.
        let priority = match i {
            0 => Priority::Interactive,
            _ if i % 2 == 1 => Priority::Background,
            _ => Priority::System,
        };
        Request::generate(Prompt::Text(texts[i].into()), params).with_priority(priority)
    };
    let mut alone = Scheduler::new(Arc::clone(&m), common::config(64, &m), None).unwrap();
    let want: Vec<Collected> = (0..texts.len())
        .map(|i| alone.serve(request(i)).unwrap())
        .collect();
    // Together in pools of 24 and 12 blocks of 8 positions (1 to 6 decoding at once: drafts
    // only while at most 4 do; in the small pool, sequences preempted and recomputed).
    for blocks in [24, 12] {
        let mut s = Scheduler::new(
            Arc::clone(&m),
            with_drafts(common::config(blocks, &m), 5),
            None,
        )
        .unwrap();
        let all = serve_together(&mut s, (0..texts.len()).map(request));
        for (i, got) in all.iter().enumerate() {
            assert!(
                got.error.is_none(),
                "{blocks} blocks, request {i}: {:?}",
                got.error
            );
            assert_eq!(reply(got), reply(&want[i]), "{blocks} blocks, request {i}");
        }
        assert!(s.stats().drafts_accepted > 0, "{:?}", s.stats());
        if blocks == 12 {
            assert!(s.stats().preemptions.total() > 0, "{:?}", s.stats());
        }
        let audit = s.kv_pool().memory().audit().unwrap();
        assert_eq!(audit.blocks_used, 0, "{audit:?}");
    }
}

#[test]
fn drafts_are_computed_as_far_as_their_cost_pays() {
    // Four greedy stories at once, under step costs fixed in advance: rows that cost nothing
    // take every draft the lookup has; rows that cost a hundred steps, none; a step whose time
    // is mostly fixed (weights streamed), some. The replies never change.
    let m = stories();
    let texts = [
        "The dog ran to the park. The dog ran to the park.",
        "Once upon a time there was a little cat who liked milk.",
        "Tom saw a big tree. Tom saw a big tree. Tom saw",
        "Lily wanted to play with her red ball.",
    ];
    let run = |cost: DraftCost| {
        let draft = DraftConfig {
            cost,
            ..DraftConfig::with_tokens(6)
        };
        let mut s = Scheduler::new(
            Arc::clone(&m),
            SchedulerConfig {
                draft,
                ..common::config(64, &m)
            },
            None,
        )
        .unwrap();
        let requests = texts
            .iter()
            .map(|t| Request::generate(Prompt::Text((*t).into()), common::greedy(48)));
        let replies: Vec<_> = serve_together(&mut s, requests).iter().map(reply).collect();
        (s.stats().clone(), replies)
    };
    let (free, want) = run(DraftCost::Free);
    let (never, got) = run(DraftCost::Fixed {
        fixed_nanos: 1_000,
        row_nanos: 100_000,
    });
    assert_eq!(got, want);
    let (streamed, got) = run(DraftCost::Fixed {
        fixed_nanos: 10_000_000,
        row_nanos: 1_000_000,
    });
    assert_eq!(got, want);
    for (name, s) in [("free", &free), ("streamed", &streamed), ("never", &never)] {
        eprintln!(
            "{name}: {} of {} drafts kept, {} steps",
            s.drafts_accepted, s.draft_tokens, s.steps
        );
    }
    assert!(free.drafts_accepted > 0, "{free:?}");
    assert_eq!(never.draft_tokens, 0, "{never:?}");
    assert!(streamed.drafts_accepted > 0, "{streamed:?}");
    assert!(
        streamed.draft_tokens < free.draft_tokens,
        "{streamed:?} {free:?}"
    );
    // Kept drafts are what pays: the cost-weighed choice wastes a smaller share of its rows.
    let kept = |s: &airs_runtime::SchedulerStats| s.drafts_accepted as f64 / s.draft_tokens as f64;
    assert!(kept(&streamed) > kept(&free), "{streamed:?} {free:?}");
}

#[test]
fn a_slow_session_commit_is_left_out_of_what_a_row_costs() {
    // The step that ends a session turn also commits it to the history store. That time is
    // the disk's, not the rows': counted, a slow disk would make every row look expensive and
    // turn drafts off. The same turns with and without a 100 ms commit give the same fit.
    let m = stories();
    let fit = |commit_delay: std::time::Duration| {
        let mut store = airs_runtime::HistoryStore::open_in_memory().unwrap();
        store.inject_commit_delay(commit_delay);
        let config = SchedulerConfig {
            draft: DraftConfig::with_tokens(4),
            ..common::config(256, &m)
        };
        let mut s = Scheduler::new(Arc::clone(&m), config, Some(store)).unwrap();
        for turn in 0..12 {
            let text = "The dog ran to the park. The dog ran to the park. The dog";
            s.serve(Request::turn(
                &format!("s{}", turn % 3),
                text,
                common::greedy(8),
            ))
            .unwrap();
        }
        let cost = s.step_cost().expect("steps of different sizes were seen");
        eprintln!("commit delay {commit_delay:?}: {cost:?}, {:?}", s.stats());
        cost
    };
    // Step times are noisy when other tests share the cores (cargo runs a file's tests in
    // parallel): the two fits are taken again, up to three times, until they agree. A commit
    // counted as row time adds 100 ms to a dozen steps of 1-5 rows, every attempt.
    let mut attempts = Vec::new();
    for _ in 0..3 {
        let quick = fit(std::time::Duration::ZERO);
        let slow = fit(std::time::Duration::from_millis(100));
        let agree = [1, 4]
            .iter()
            .all(|&rows| slow.seconds(rows) < 2.0 * quick.seconds(rows) + 0.002);
        if agree {
            return;
        }
        attempts.push((quick, slow));
    }
    panic!("the slow commits' fit never came near the quick one's: {attempts:?}");
}
