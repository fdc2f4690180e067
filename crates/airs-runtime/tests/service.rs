//! The engine thread ([`Service`]): what runs on it and what does not.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airs_memory::PinPolicy;
use airs_runtime::service::Service;
use airs_runtime::{
    ErrorClass, Event, GenerationParams, LoadedModel, Prompt, Request, RuntimeErrorKind, Scheduler,
    SchedulerConfig,
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

/// A panic on the engine thread (an engine bug) stops it without hanging anyone: the request
/// it was running loses its sink (its front end sees the end of its events without a `Done`),
/// by then `Service::failure` names the panic, every later request fails at once with
/// `EngineFailed` carrying the message, and shutting the service down returns.
#[test]
fn a_panicking_engine_fails_every_later_request_with_its_message() {
    let model = Arc::new(LoadedModel::open(&airs_testdata::stories_path(), 1).unwrap());
    let mut config = SchedulerConfig::new(16 << 20);
    config.pin = PinPolicy::None;
    let service = Arc::new(Service::start(
        Scheduler::new(Arc::clone(&model), config, None).unwrap(),
    ));
    let params = GenerationParams {
        max_tokens: 100_000,
        ignore_eos: true,
        ..GenerationParams::default()
    };
    // A running request whose sink, when dropped, notes what the service reports then.
    struct Dropped(Arc<Service>, Arc<Mutex<Option<Option<String>>>>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            *self.1.lock().unwrap() = Some(self.0.failure().map(str::to_string));
        }
    }
    let tokens: Arc<Mutex<usize>> = Arc::default();
    let dropped: Arc<Mutex<Option<Option<String>>>> = Arc::default();
    let done: Arc<Mutex<bool>> = Arc::default();
    let (t, d, guard) = (
        Arc::clone(&tokens),
        Arc::clone(&done),
        Dropped(Arc::clone(&service), Arc::clone(&dropped)),
    );
    service.submit(
        Request::generate(Prompt::Text("Once upon a time".into()), params.clone()),
        Box::new(move |e| {
            let _ = &guard;
            match e {
                Event::Token(_) => *t.lock().unwrap() += 1,
                Event::Done(_) | Event::Failed(_) => *d.lock().unwrap() = true,
                _ => {}
            }
            true
        }),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while *tokens.lock().unwrap() < 5 {
        assert!(Instant::now() < deadline, "no tokens");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(service.failure(), None);
    service.inject_panic("an engine invariant broke");
    while dropped.lock().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the running request's sink was not dropped"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        *dropped.lock().unwrap(),
        Some(Some("an engine invariant broke".to_string())),
        "the failure was not readable when the running request's events ended"
    );
    assert!(
        !*done.lock().unwrap(),
        "a request the panic cut short reported an end"
    );
    // A later request fails at once, with the panic's message.
    let events: Arc<Mutex<Vec<Event>>> = Arc::default();
    let e = Arc::clone(&events);
    service.submit(
        Request::generate(Prompt::Text("Once upon a time".into()), params),
        Box::new(move |ev| {
            e.lock().unwrap().push(ev);
            true
        }),
    );
    let events = std::mem::take(&mut *events.lock().unwrap());
    match &events[..] {
        [Event::Failed(err)] => {
            assert!(
                matches!(err.kind(), RuntimeErrorKind::EngineFailed(m) if m == "an engine invariant broke"),
                "{err}"
            );
            assert_eq!(err.class(), ErrorClass::Unavailable);
        }
        other => panic!("expected one failure, got {other:?}"),
    }
    // Shutting down a stopped service returns at once.
    let report = service.shutdown(Duration::from_secs(5));
    assert_eq!((report.finished, report.cancelled), (0, 0));
}
