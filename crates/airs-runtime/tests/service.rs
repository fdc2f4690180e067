//! The engine thread ([`Service`]): what runs on it and what does not.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airs_memory::PinPolicy;
use airs_runtime::service::Service;
use airs_runtime::{
    Event, GenerationParams, LoadedModel, Prompt, Request, Scheduler, SchedulerConfig,
};

/// A text prompt is tokenized by `Service::submit` on the submitting thread, not on the engine
/// thread, where every running sequence would wait for it: while a long prompt is tokenized,
/// a request that is decoding keeps getting tokens.
#[test]
fn a_long_prompt_is_tokenized_beside_the_engine_not_on_it() {
    let model = Arc::new(LoadedModel::open(&airs_testdata::stories_path(), 1).unwrap());
    let mut config = SchedulerConfig::new(16 << 20);
    config.pin = PinPolicy::None;
    let service = Service::start(Scheduler::new(Arc::clone(&model), config, None).unwrap());
    let params = |max_tokens| GenerationParams {
        max_tokens,
        ignore_eos: true,
        ..GenerationParams::default()
    };
    // A decodes its whole context.
    let times: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let t = Arc::clone(&times);
    service.submit(
        Request::generate(Prompt::Text("Once upon a time".into()), params(2000)),
        Box::new(move |e| {
            if matches!(e, Event::Token(_)) {
                t.lock().unwrap().push(Instant::now());
            }
            true
        }),
    );
    while times.lock().unwrap().len() < 20 {
        std::thread::sleep(Duration::from_millis(1));
    }
    // B: a prompt far longer than the context (refused once tokenized), submitted from here.
    let long = "Once upon a time, there was a little girl named Lily. ".repeat(30_000);
    let refused: Arc<Mutex<Vec<Event>>> = Arc::default();
    let r = Arc::clone(&refused);
    let start = Instant::now();
    service.submit(
        Request::generate(Prompt::Text(long), params(4)),
        Box::new(move |e| {
            r.lock().unwrap().push(e);
            true
        }),
    );
    let end = Instant::now();
    let tokenizing = end - start;
    // A's tokens while B was tokenized, and the longest wait between two of them.
    let times = times.lock().unwrap().clone();
    let during: Vec<Instant> = times
        .iter()
        .copied()
        .filter(|&t| t >= start && t <= end)
        .collect();
    let longest = during
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or(tokenizing);
    assert!(
        during.len() >= 3 && longest < tokenizing / 2,
        "{} tokens while B was tokenized ({tokenizing:?}), longest gap {longest:?}",
        during.len()
    );
    // B is refused (too long for the context) by the engine.
    let deadline = Instant::now() + Duration::from_secs(30);
    while refused.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "no answer to B");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(matches!(refused.lock().unwrap()[0], Event::Failed(_)));
}
