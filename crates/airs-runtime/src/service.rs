//! The engine thread: a [`Scheduler`] running on a thread of its own, fed through a channel, so
//! that a front end that serves many clients (the HTTP server) never runs the engine itself and
//! never waits for it. Submitting and cancelling send a command and return at once; events come
//! back through each request's [`Sink`]; a [`Status`] snapshot (counters, pool map, sessions)
//! is published after steps for readers that must not wait for the engine (`/metrics`,
//! `/v1/pool`).
//!
//! Shutdown ([`Service::shutdown`]): no new request is admitted; requests in flight get a grace
//! period to finish, then the rest are cancelled (their clients get
//! [`RuntimeErrorKind::ShuttingDown`]); every completed session turn was committed when it
//! completed, so the histories are intact.
//!
//! Failure: a panic on the engine thread (a bug: an engine invariant broken) stops it. The
//! requests it held lose their sinks (their front ends see the channel close), every later
//! request gets [`RuntimeErrorKind::EngineFailed`] with the panic's message, and
//! [`Service::failure`] reports it, so a front end can drop the service and load the model
//! again (the server does at the model's next request); completed session turns were
//! committed when they completed, so nothing acknowledged is lost.
//!
//! Cost: one channel send per command; the engine thread sleeps on the channel when idle (no
//! spinning); a status snapshot at most every [`STATUS_INTERVAL`] while busy.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use airs_memory::PoolUsage;
use serde::Serialize;

use crate::draft_cost::StepCost;
use crate::error::{RuntimeError, RuntimeErrorKind};
use crate::metrics::SchedulerStats;
use crate::model::LoadedModel;
use crate::request::{Event, OutputFormat, Prompt, Request, RequestId, Task};
use crate::scheduler::{PoolMap, Scheduler, SessionSummary, Sink};

/// Most time between two status snapshots while the engine is busy.
pub const STATUS_INTERVAL: Duration = Duration::from_millis(200);

/// The engine's state at one instant, as the engine thread last published it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Status {
    /// Sequences running and requests waiting.
    pub running: usize,
    pub waiting: usize,
    pub stats: SchedulerStats,
    pub pool: PoolMap,
    /// The model pool's account.
    pub model_pool: ModelPoolUsage,
    pub sessions: Vec<SessionSummary>,
    /// Whether the weights are still loading, and how far along.
    pub loading: bool,
    pub loaded_bytes: u64,
    pub region_bytes: u64,
    /// What a step costs in time against its rows, as the scheduler measures it
    /// ([`crate::draft_cost`]).
    pub step_cost: Option<StepCost>,
    /// When the snapshot was taken, as seconds since the service started.
    pub at_seconds: f64,
}

/// The model pool's account (bytes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ModelPoolUsage {
    pub capacity_bytes: u64,
    pub weights_bytes: u64,
    pub kv_cache_bytes: u64,
    pub scratch_bytes: u64,
    pub free_bytes: u64,
}

impl From<PoolUsage> for ModelPoolUsage {
    fn from(u: PoolUsage) -> ModelPoolUsage {
        ModelPoolUsage {
            capacity_bytes: u.capacity_bytes,
            weights_bytes: u.weights_bytes,
            kv_cache_bytes: u.kv_cache_bytes,
            scratch_bytes: u.scratch_bytes,
            free_bytes: u.free_bytes(),
        }
    }
}

/// What a shutdown did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ShutdownReport {
    /// Requests that finished within the grace period, and those cancelled after it.
    pub finished: u64,
    pub cancelled: u64,
}

enum Command {
    Submit(RequestId, Box<Request>, Sink),
    Cancel(RequestId),
    Shutdown(Duration, mpsc::Sender<ShutdownReport>),
    /// Panic on the engine thread (tests of the failure path).
    #[cfg(feature = "fault-injection")]
    Panic(String),
}

/// A scheduler on its engine thread (see the module documentation).
pub struct Service {
    commands: mpsc::Sender<Command>,
    status: Arc<Mutex<Status>>,
    next_id: AtomicU64,
    model: Arc<LoadedModel>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The panic message that stopped the engine thread, once it has.
    failure: Arc<OnceLock<String>>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("model", &self.model.name)
            .finish_non_exhaustive()
    }
}

impl Service {
    /// Start `scheduler` on its engine thread.
    pub fn start(scheduler: Scheduler) -> Service {
        let (tx, rx) = mpsc::channel();
        let status = Arc::new(Mutex::new(Status::default()));
        let model = Arc::clone(scheduler.model());
        let shared = Arc::clone(&status);
        let failure = Arc::new(OnceLock::new());
        let failed = Arc::clone(&failure);
        let thread = std::thread::Builder::new()
            .name("airs-engine".into())
            .spawn(move || {
                let mut scheduler = scheduler;
                if let Err(payload) = catch_unwind(AssertUnwindSafe(|| {
                    engine_loop(&mut scheduler, &rx, &shared)
                })) {
                    let message = payload
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic without a message".into());
                    let _ = failed.set(message);
                }
                // Only now are the command channel and the scheduler dropped (every sink they
                // hold with them): a front end that sees its events end finds the failure. The
                // channel first: a request submitted once a running request's sink was dropped
                // must find the channel closed and fail at once, not queue into a channel about
                // to be dropped with it (which ended its events without a failure: a flaky
                // `a_panicking_engine_fails_every_later_request_with_its_message`).
                drop(rx);
                drop(scheduler);
            })
            .expect("spawning the engine thread");
        Service {
            commands: tx,
            status,
            next_id: AtomicU64::new(0),
            model,
            thread: Mutex::new(Some(thread)),
            failure,
        }
    }

    /// Why the engine thread stopped, if it stopped on a panic: the service runs nothing more
    /// (see the module documentation).
    pub fn failure(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }

    /// Make the engine thread panic with `message` between two steps, as an engine bug would.
    #[cfg(feature = "fault-injection")]
    pub fn inject_panic(&self, message: &str) {
        let _ = self.commands.send(Command::Panic(message.to_string()));
    }

    /// The model the service serves (tokenizer, template, shape: shared, immutable).
    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.model
    }

    /// Queue `request`; returns once its prompt is tokenized. Its events, including a refusal
    /// ([`Event::Failed`]: bad request, queue full, too large for the pool, shutting down),
    /// go to `sink`.
    ///
    /// A text or chat prompt (not a session turn's, which needs the session's history) is
    /// tokenized here, on the caller's thread: the engine thread takes commands between two
    /// steps, and every sequence it runs would wait while it tokenized (the Qwen2.5 tokenizer
    /// encodes about 5 MB/s, `cargo bench -p airs-tokenizer`: a 128 KiB prompt held every
    /// stream for ~25 ms, about a 16-sequence step). So is, for the first request constrained
    /// to an output format, the model's table of token bytes ([`LoadedModel::vocab_bytes`]).
    pub fn submit(&self, mut request: Request, mut sink: Sink) -> RequestId {
        let id = RequestId(self.next_id.fetch_add(1, Ordering::Relaxed));
        if let Task::Generate(params) = &request.task
            && !matches!(params.format, OutputFormat::Text)
        {
            self.model.vocab_bytes();
        }
        if request.session.is_none() {
            let prompt = std::mem::replace(&mut request.prompt, Prompt::Tokens(Vec::new()));
            match self.model.prompt_tokens(prompt) {
                Ok(tokens) => request.prompt = Prompt::Tokens(tokens),
                Err(e) => {
                    let _ = sink(Event::Failed(e));
                    return id;
                }
            }
        }
        if let Err(mpsc::SendError(Command::Submit(_, _, mut sink))) = self
            .commands
            .send(Command::Submit(id, Box::new(request), sink))
        {
            // The engine thread is gone: shut down, or stopped by a panic.
            let kind = match self.failure() {
                Some(message) => RuntimeErrorKind::EngineFailed(message.to_string()),
                None => RuntimeErrorKind::ShuttingDown,
            };
            let _ = sink(Event::Failed(RuntimeError::new(kind)));
        }
        id
    }

    /// Cancel request `id` (its blocks return to the pool before the next step).
    pub fn cancel(&self, id: RequestId) {
        let _ = self.commands.send(Command::Cancel(id));
    }

    /// The latest status snapshot.
    pub fn status(&self) -> Status {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Stop admitting requests, let those in flight finish for up to `grace`, cancel the rest,
    /// and stop the engine thread.
    pub fn shutdown(&self, grace: Duration) -> ShutdownReport {
        let (tx, rx) = mpsc::channel();
        let report = if self.commands.send(Command::Shutdown(grace, tx)).is_ok() {
            rx.recv().unwrap_or_default()
        } else {
            ShutdownReport::default()
        };
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
        report
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.shutdown(Duration::ZERO);
    }
}

fn publish(scheduler: &Scheduler, status: &Mutex<Status>, started: Instant) {
    let model = scheduler.model();
    let (loading, loaded, total) = match model.region() {
        Some(r) => {
            let p = r.loader().progress();
            (!r.loader().is_resident(), p.filled_bytes, p.total_bytes)
        }
        None => {
            let n = model.model.image().bytes().len() as u64;
            (false, n, n)
        }
    };
    let s = Status {
        running: scheduler.running_len(),
        waiting: scheduler.waiting_len(),
        stats: scheduler.stats().clone(),
        pool: scheduler.pool_map(),
        model_pool: model.pool().usage().into(),
        sessions: scheduler.sessions(),
        loading,
        loaded_bytes: loaded,
        region_bytes: total,
        step_cost: scheduler.step_cost(),
        at_seconds: started.elapsed().as_secs_f64(),
    };
    *status.lock().unwrap_or_else(|e| e.into_inner()) = s;
}

fn engine_loop(scheduler: &mut Scheduler, rx: &mpsc::Receiver<Command>, status: &Mutex<Status>) {
    let started = Instant::now();
    let mut published = Instant::now();
    publish(scheduler, status, started);
    let mut shutdown: Option<(Instant, mpsc::Sender<ShutdownReport>)> = None;
    let completed_at_start = scheduler.stats().completed;
    loop {
        // Take every command waiting; when there is nothing to do, sleep on the channel.
        let mut first = if scheduler.has_work() || shutdown.is_some() {
            None
        } else {
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(c) => Some(c),
                Err(RecvTimeoutError::Timeout) => {
                    publish(scheduler, status, started);
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
        };
        loop {
            let cmd = match first.take() {
                Some(c) => c,
                None => match rx.try_recv() {
                    Ok(c) => c,
                    Err(_) => break,
                },
            };
            match cmd {
                Command::Submit(id, request, mut sink) => {
                    if shutdown.is_some() {
                        let _ = sink(Event::Failed(RuntimeError::new(
                            RuntimeErrorKind::ShuttingDown,
                        )));
                        continue;
                    }
                    if let Err(mut refused) = scheduler.submit_as(id, *request, sink) {
                        let _ = (refused.sink)(Event::Failed(refused.error));
                    }
                }
                Command::Cancel(id) => scheduler.cancel(id),
                Command::Shutdown(grace, reply) => {
                    shutdown = Some((Instant::now() + grace, reply));
                }
                #[cfg(feature = "fault-injection")]
                Command::Panic(message) => panic!("{message}"),
            }
        }
        if let Some((deadline, _)) = &shutdown
            && (!scheduler.has_work() || Instant::now() >= *deadline)
        {
            let finished = scheduler.stats().completed - completed_at_start;
            let cancelled =
                scheduler.fail_all(|| RuntimeError::new(RuntimeErrorKind::ShuttingDown));
            publish(scheduler, status, started);
            let (_, reply) = shutdown.take().expect("checked");
            let _ = reply.send(ShutdownReport {
                finished,
                cancelled,
            });
            return;
        }
        if scheduler.has_work() {
            scheduler.step();
        }
        if published.elapsed() >= STATUS_INTERVAL || !scheduler.has_work() {
            publish(scheduler, status, started);
            published = Instant::now();
        }
    }
}
