//! The scheduler on real models: requests served together (joining and leaving the running
//! batch at every step, decode rows beside prefill chunks) produce exactly what each produces
//! alone; a shared prefix arriving together is computed once; `n` choices share the prompt's
//! blocks; cancellation returns every block; an interactive request preempts background work,
//! which then finishes exactly as it would have; embeddings are the pooled hidden states.
mod common;

use std::sync::{Arc, Mutex};

use airs_engine::{KvType, SamplerConfig};
use airs_memory::PinPolicy;
use airs_runtime::{
    Collected, Event, GenerationParams, LoadedModel, Priority, Prompt, Request, RequestId,
    Scheduler, SchedulerConfig, SchedulerEvent,
};
use airs_tokenizer::chat::ChatMessage;
use common::greedy;

const STORIES: [&str; 6] = [
    "Once upon a time there was a little cat.",
    "The dog ran to the park and saw a big tree.",
    "Lily wanted to play with her red ball, but it was raining.",
    "Tom and Sue went to the shop.",
    "One day, a bird found a shiny stone.",
    "Mom said: be careful with the glass!",
];

fn scheduler(model: &Arc<LoadedModel>, kv_bytes: usize, max_running: usize) -> Scheduler {
    let mut c = SchedulerConfig::new(kv_bytes);
    c.pin = PinPolicy::None;
    c.max_running = max_running;
    Scheduler::new(Arc::clone(model), c, None).unwrap()
}

/// `request` served alone on a fresh scheduler with room to spare.
fn alone(model: &Arc<LoadedModel>, request: Request) -> Collected {
    scheduler(model, 64 << 20, 4).serve(request).unwrap()
}

/// Submit `requests` at the steps given, run until all are done; what each produced, in the
/// order given.
fn together(s: &mut Scheduler, requests: Vec<(u64, Request)>) -> Vec<Collected> {
    let mut pending: Vec<(usize, u64, Request)> = requests
        .into_iter()
        .enumerate()
        .map(|(i, (at, r))| (i, at, r))
        .collect();
    pending.sort_by_key(|(_, at, _)| *at);
    let mut cells = Vec::new();
    let mut queue = pending.into_iter().peekable();
    let mut step = 0;
    loop {
        while queue.peek().is_some_and(|(_, at, _)| *at <= step) {
            let (i, _, r) = queue.next().unwrap();
            let (sink, cell) = Collected::sink();
            s.submit(r, sink).unwrap();
            cells.push((i, cell));
        }
        if !s.has_work() && queue.peek().is_none() {
            break;
        }
        s.step();
        step += 1;
    }
    cells.sort_by_key(|(i, _)| *i);
    cells
        .into_iter()
        .map(|(_, c)| std::mem::take(&mut *c.lock().unwrap()))
        .collect()
}

fn text_request(text: &str, max_tokens: usize, priority: Priority) -> Request {
    Request::generate(Prompt::Text(text.into()), greedy(max_tokens)).with_priority(priority)
}

fn requests_together_equal_alone(model: &Arc<LoadedModel>, texts: &[&str], max_tokens: usize) {
    let priorities = [
        Priority::Interactive,
        Priority::Background,
        Priority::System,
    ];
    let make = |i: usize| text_request(texts[i], max_tokens + i % 3, priorities[i % 3]);
    let want: Vec<Vec<u32>> = (0..texts.len())
        .map(|i| alone(model, make(i)).first().tokens.clone())
        .collect();
    let mut s = scheduler(model, 64 << 20, 8);
    // Arrivals spread over the first steps: most steps mix decode rows and prefill chunks.
    let got = together(
        &mut s,
        (0..texts.len()).map(|i| (i as u64 % 4, make(i))).collect(),
    );
    for (i, c) in got.iter().enumerate() {
        assert!(c.error.is_none(), "request {i}: {:?}", c.error);
        assert_eq!(c.first().tokens, want[i], "request {i} differs from alone");
    }
    assert!(
        s.stats().peak_batch >= 3,
        "requests were batched: {:?}",
        s.stats()
    );
    assert_eq!(s.kv_pool().memory().audit().unwrap().blocks_used, 0);
}

#[test]
fn stories_requests_served_together_equal_each_served_alone() {
    let model = common::model();
    requests_together_equal_alone(&model, &STORIES, 24);
}

#[test]
fn qwen_requests_served_together_equal_each_served_alone() {
    let model = Arc::new(LoadedModel::open(&airs_testdata::qwen_path(), 2).unwrap());
    let texts = [
        "def fibonacci(n):",
        "The capital of France is",
        "import numpy as np\n\n# Compute the mean of a list",
        "Write a haiku about memory:",
        "SELECT name FROM users WHERE",
    ];
    requests_together_equal_alone(&model, &texts, 10);
}

/// Sampled requests asking for log-probabilities, served together (their draws made on the
/// engine's threads, several a step) and each alone: the same tokens and the same
/// log-probabilities, bit for bit.
#[test]
fn sampled_requests_with_log_probabilities_together_equal_each_alone() {
    // Two threads: the draws of a step are split between them.
    let model = Arc::new(LoadedModel::open(&airs_testdata::stories_path(), 2).unwrap());
    let make = |i: usize| {
        let params = GenerationParams {
            logprobs: Some(3),
            sampler: SamplerConfig {
                temperature: 0.9,
                seed: 11 + i as u64,
                ..SamplerConfig::default()
            },
            ..greedy(20)
        };
        Request::generate(Prompt::Text(STORIES[i].into()), params)
    };
    let events = |c: &Collected| -> Vec<String> {
        c.tokens
            .iter()
            .map(|t| format!("{:?} {:?}", t.id, t.logprobs))
            .collect()
    };
    let want: Vec<Vec<String>> = (0..STORIES.len())
        .map(|i| events(&alone(&model, make(i))))
        .collect();
    let mut s = scheduler(&model, 64 << 20, 8);
    let got = together(
        &mut s,
        (0..STORIES.len())
            .map(|i| (i as u64 % 2, make(i)))
            .collect(),
    );
    for (i, c) in got.iter().enumerate() {
        assert!(c.error.is_none(), "request {i}: {:?}", c.error);
        assert_eq!(events(c).len(), 20);
        assert_eq!(events(c), want[i], "request {i} differs from alone");
    }
    assert!(s.stats().peak_batch >= 4, "{:?}", s.stats());
}

/// Four requests with a 593-token common prefix arriving at the same moment: the first
/// computes the prefix; the others wait for its blocks instead of computing them again.
#[test]
fn a_shared_prefix_arriving_together_is_computed_once() {
    let model = common::model();
    let base = STORIES.join(" ");
    let mut prefix = model.encode_prompt(&base.repeat(30));
    prefix.truncate(593);
    let suffixes = ["What happened?", "Who was there?", "Why?", "The end."];
    let make = |i: usize| {
        let mut ids = prefix.clone();
        let s = model
            .tokenizer
            .encode(suffixes[i], airs_tokenizer::EncodeOptions::default());
        ids.extend(s.into_iter().map(u32::from));
        Request::generate(Prompt::Tokens(ids), greedy(4))
    };
    let total: usize = (0..4)
        .map(|i| match &make(i).prompt {
            Prompt::Tokens(t) => t.len(),
            _ => 0,
        })
        .sum();
    let mut s = scheduler(&model, 64 << 20, 8);
    let got = together(&mut s, (0..4).map(|i| (0, make(i))).collect());
    let stats = s.stats();
    // The prefix's whole blocks (592 positions) are computed once; each request computes the
    // rest of its own prompt.
    let tpb = 16;
    let shared = 593 / tpb * tpb;
    assert_eq!(
        stats.prefill_tokens as usize,
        total - 3 * shared,
        "{stats:?}"
    );
    assert_eq!(stats.prefix_hit_tokens as usize, 3 * shared);
    for (i, c) in got.iter().enumerate() {
        let (_, cached) = c.admitted.unwrap();
        assert_eq!(cached, if i == 0 { 0 } else { shared }, "request {i}");
        assert_eq!(c.done.as_ref().unwrap().usage.cached_tokens, cached);
        assert_eq!(c.first().tokens, alone(&model, make(i)).first().tokens);
    }
}

/// `n` choices: the prompt is computed once and its blocks shared (copy-on-write); greedy
/// choices agree, seeded ones draw on their own.
#[test]
fn choices_share_the_prompts_blocks() {
    let model = common::model();
    let prompt = STORIES.join(" ");
    let mut s = scheduler(&model, 64 << 20, 8);
    let params = GenerationParams {
        max_tokens: 12,
        n: 3,
        sampler: SamplerConfig {
            temperature: 1.0,
            seed: 5,
            ..SamplerConfig::default()
        },
        ..GenerationParams::default()
    };
    let (sink, cell) = Collected::sink();
    let id = s
        .submit(
            Request::generate(Prompt::Text(prompt.clone()), params.clone()),
            sink,
        )
        .unwrap();
    // Step until the choices exist, then look at the pool: they share the prompt's blocks.
    let prompt_len = model.encode_prompt(&prompt).len();
    let mut shared_seen = false;
    while s.has_work() {
        s.step();
        let seqs = s.sequences();
        if seqs.len() == 3 {
            let map = s.pool_map();
            shared_seen |= map.shared_blocks.len() >= prompt_len / 16;
        }
    }
    assert!(shared_seen, "the choices shared the prompt's full blocks");
    let c = std::mem::take(&mut *cell.lock().unwrap());
    assert_eq!(c.choices.len(), 3);
    assert_eq!(
        s.stats().prefill_tokens as usize,
        prompt_len,
        "prompt computed once"
    );
    let texts: Vec<&Vec<u32>> = c.choices.iter().map(|x| &x.tokens).collect();
    assert!(
        texts[0] != texts[1] || texts[1] != texts[2],
        "seeded choices differ"
    );
    assert_eq!(c.done.unwrap().usage.completion_tokens, 36);
    let _ = id;
    // Greedy: all the same.
    let g = s
        .serve(Request::generate(
            Prompt::Text(prompt),
            GenerationParams { n: 2, ..greedy(8) },
        ))
        .unwrap();
    assert_eq!(g.choices[0].tokens, g.choices[1].tokens);
}

#[test]
fn cancelling_returns_every_block() {
    let model = common::model();
    let mut s = scheduler(&model, 8 << 20, 8);
    let ids: Vec<RequestId> = (0..4)
        .map(|i| {
            s.submit(
                text_request(STORIES[i], 200, Priority::Interactive),
                Box::new(|_| true),
            )
            .unwrap()
        })
        .collect();
    for _ in 0..5 {
        s.step();
    }
    let used = s.kv_pool().memory().audit().unwrap().blocks_used;
    assert!(used > 0);
    for id in &ids[..2] {
        s.cancel(*id);
    }
    let after = s.kv_pool().memory().audit().unwrap();
    assert!(after.blocks_used < used);
    // A sink whose receiver went away cancels its request at the next step.
    let gone = s
        .submit(
            text_request(STORIES[5], 200, Priority::Interactive),
            Box::new(|_| false),
        )
        .unwrap();
    s.step();
    s.step();
    assert!(s.sequences().iter().all(|q| q.request != gone));
    for id in &ids[2..] {
        s.cancel(*id);
    }
    let audit = s.kv_pool().memory().audit().unwrap();
    assert_eq!(audit.blocks_used, 0, "{audit:?}");
    assert!(!s.has_work());
    assert_eq!(s.stats().cancelled, 5);
}

/// Background sequences fill the pool; an interactive request preempts them, is served, and the
/// background requests are recomputed and finish exactly as they would have alone.
#[test]
fn an_interactive_request_preempts_background_work_which_then_finishes_identically() {
    let model = common::model();
    let bpt = model.kv_shape().bytes_per_token(KvType::F16).unwrap();
    // Room for about 3 sequences of 100 positions.
    let mut s = scheduler(&model, 320 * bpt, 8);
    let bg = |i: usize| text_request(STORIES[i], 80, Priority::Background);
    let fg = text_request(STORIES[5], 80, Priority::Interactive);
    let got = together(
        &mut s,
        vec![(0, bg(0)), (0, bg(1)), (0, bg(2)), (0, bg(3)), (30, fg)],
    );
    let events = s.take_events();
    let preempted: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            SchedulerEvent::Preempted { priority, .. } => Some(*priority),
            _ => None,
        })
        .collect();
    assert!(!preempted.is_empty(), "the pool was too small for everyone");
    assert!(preempted.iter().all(|&p| p == Priority::Background));
    for e in &events {
        airs_runtime::invariants::check_event(e, s.config().idle_threshold).unwrap();
    }
    for (i, c) in got.iter().enumerate() {
        assert!(c.error.is_none(), "request {i}: {:?}", c.error);
        let want = if i < 4 {
            alone(&model, bg(i))
        } else {
            alone(&model, text_request(STORIES[5], 80, Priority::Interactive))
        };
        assert_eq!(c.first().tokens, want.first().tokens, "request {i}");
    }
    assert_eq!(got[4].done.as_ref().unwrap().preemptions, 0);
}

/// Embeddings: the mean of the final hidden states after the output norm, L2-normalized, the
/// same whether the prompt is computed in one step or in chunks.
#[test]
fn embeddings_are_pooled_hidden_states() {
    let model = common::model();
    let text = STORIES.join(" ");
    let e = alone(&model, Request::embed(Prompt::Text(text.clone())));
    let v = e.embedding.unwrap();
    assert_eq!(v.values.len(), model.model.config.embedding_len);
    let norm: f64 = v.values.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    // In chunks of 16 rows per step: the same vector.
    let mut c = SchedulerConfig::new(8 << 20);
    c.pin = PinPolicy::None;
    c.step_tokens = 16;
    c.max_running = 4;
    let mut small = Scheduler::new(Arc::clone(&model), c, None).unwrap();
    let chunked = small.serve(Request::embed(Prompt::Text(text))).unwrap();
    assert_eq!(chunked.embedding.unwrap().values, v.values);
    // Different texts, different embeddings.
    let other = alone(&model, Request::embed(Prompt::Text(STORIES[0].into())));
    assert_ne!(other.embedding.unwrap().values, v.values);
}

/// Chat prompts render with the template; the events stream tokens whose texts add up to the
/// choice's text, and the choice ends with the tail.
#[test]
fn streamed_text_adds_up_to_the_choice_text() {
    let model = Arc::new(LoadedModel::open(&airs_testdata::qwen_path(), 2).unwrap());
    let mut s = scheduler(&model, 16 << 20, 4);
    let events = Arc::new(Mutex::new(Vec::new()));
    let e = Arc::clone(&events);
    let params = GenerationParams {
        stop: vec!["\n\n".into()],
        logprobs: Some(3),
        ..greedy(40)
    };
    let id = s
        .submit(
            Request::generate(
                Prompt::Chat(vec![ChatMessage::user("Write a Python hello world.")]),
                params,
            ),
            Box::new(move |ev| {
                e.lock().unwrap().push(ev);
                true
            }),
        )
        .unwrap();
    s.run_until_done(id);
    let events = std::mem::take(&mut *events.lock().unwrap());
    let mut text = String::new();
    let mut end = None;
    for ev in events {
        match ev {
            Event::Token(t) => {
                let lp = t.logprobs.unwrap();
                assert_eq!(lp.top.len(), 3);
                assert!(lp.logprob <= 0.0 && lp.top[0].1 >= lp.logprob);
                text.push_str(&t.text);
            }
            Event::ChoiceEnd(c) => {
                text.push_str(&c.tail);
                end = Some(c);
            }
            _ => {}
        }
    }
    let end = end.unwrap();
    assert_eq!(text, end.text);
    assert!(!end.text.contains("\n\n"));
}
