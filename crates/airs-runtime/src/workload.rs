//! Scripted session workloads for `airs bench sessions`: a mix of interactive, system and
//! background sessions taking turns on a simulated clock against a KV pool too small for all
//! of them — the turns of one time step are submitted together and served by the scheduler at
//! once — with the §6.3 invariants checked after every scheduler step and, optionally, every
//! reply compared with the same workload served by a pool that never evicts.
//!
//! Workload files are JSON:
//!
//! ```json
//! {
//!   "name": "mixed",
//!   "max_tokens": 16,
//!   "step_seconds": 60,
//!   "idle_threshold_seconds": 300,
//!   "sessions": [
//!     { "name": "chat-1", "priority": "interactive", "steps": [0, 1, 2, 10],
//!       "turns": ["Hello!", "Tell me a story.", "And then?", "How did it end?"] },
//!     { "name": "svc-1", "priority": "system", "system": "You check requests.",
//!       "start": 1, "every": 3, "turns": ["Check: open the door.", "Check: send mail."] }
//!   ]
//! }
//! ```
//!
//! Time advances in steps of `step_seconds` (default 60) on a manual clock, so idleness is
//! simulated, not waited for. At step `t` each session, in file order, submits its next turn if
//! `t` is in its `steps` list, or — without a list — if `t ≥ start` (default 0) and
//! `(t − start)` is a multiple of `every` (default 1). The run ends when every session has used
//! all its `turns`. Per session, `max_tokens` overrides the workload's (default 16), `system`
//! opens the conversation with a system message, `salt` scopes its prefix sharing, and
//! `temperature` and `seed` set its sampler (default greedy, seed 0).
//! `idle_threshold_seconds` defaults to 300 (the runtime's 5 minutes). Sessions sharing a
//! `system` prompt share its KV blocks through the prefix index.
//!
//! Presets: `mixed` (2 interactive, one of which goes idle and comes back; 2 system sessions
//! with a shared system prompt; 4 background; several turns each). `workloads/short.json` in
//! this crate is a shorter mix for larger models (8-token replies).
//!
//! Cost: the workload's forward passes (twice with verification), plus a pool audit and an
//! invariant check per scheduler step.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airs_engine::{KvType, SamplerConfig};
use airs_memory::PinPolicy;
use airs_memory::eviction::Priority;
use serde::{Deserialize, Serialize};

use crate::error::{Result, RuntimeError, RuntimeErrorKind};
use crate::idle::ManualClock;
use crate::invariants::{check_event, check_model_pool, check_pool};
use crate::lookup::DraftConfig;
use crate::metrics::PerPriority;
use crate::model::LoadedModel;
use crate::request::{Event, GenerationParams, Request, SessionTurn};
use crate::scheduler::{Scheduler, SchedulerConfig, SchedulerEvent};
use crate::service::ModelPoolUsage;
use crate::store::HistoryStore;

fn default_max_tokens() -> usize {
    16
}

fn default_step_seconds() -> f64 {
    60.0
}

fn default_idle_seconds() -> f64 {
    300.0
}

fn default_every() -> usize {
    1
}

/// One session of a workload (see the module documentation).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSession {
    pub name: String,
    /// `interactive`, `system` or `background`.
    pub priority: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub salt: Option<String>,
    /// Steps at which the session speaks, increasing (overrides `start`/`every`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<usize>>,
    #[serde(default)]
    pub start: usize,
    #[serde(default = "default_every")]
    pub every: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<usize>,
    /// Sampling temperature (default 0: greedy).
    #[serde(default)]
    pub temperature: f32,
    /// Sampler seed (default 0).
    #[serde(default)]
    pub seed: u64,
    pub turns: Vec<String>,
}

/// A scripted workload (see the module documentation).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    #[serde(default)]
    pub name: String,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    #[serde(default = "default_step_seconds")]
    pub step_seconds: f64,
    #[serde(default = "default_idle_seconds")]
    pub idle_threshold_seconds: f64,
    pub sessions: Vec<WorkloadSession>,
}

/// One request of a workload's schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledTurn {
    pub step: usize,
    /// Index into `sessions`.
    pub session: usize,
    /// Index into that session's `turns`.
    pub turn: usize,
}

impl Workload {
    /// Parse a workload file's text.
    pub fn from_json(text: &str) -> Result<Workload> {
        let w: Workload = serde_json::from_str(text)
            .map_err(|e| RuntimeError::new(RuntimeErrorKind::Workload(e.to_string())))?;
        w.validate()?;
        Ok(w)
    }

    /// A named preset, or the file at `name_or_path`.
    pub fn load(name_or_path: &str) -> Result<Workload> {
        if let Some(w) = Workload::preset(name_or_path) {
            return Ok(w);
        }
        let text = std::fs::read_to_string(name_or_path).map_err(|e| {
            RuntimeError::new(RuntimeErrorKind::Workload(format!(
                "{name_or_path:?} is neither a preset (mixed) nor a readable file: {e}"
            )))
        })?;
        Workload::from_json(&text)
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(RuntimeError::new(RuntimeErrorKind::Workload(m)));
        if self.sessions.is_empty() {
            return bad("no sessions".into());
        }
        if !(self.step_seconds >= 0.0 && self.idle_threshold_seconds >= 0.0) {
            return bad("step_seconds and idle_threshold_seconds must be non-negative".into());
        }
        let mut names = std::collections::HashSet::new();
        for s in &self.sessions {
            if !names.insert(&s.name) {
                return bad(format!("session {:?} appears twice", s.name));
            }
            if let Err(e) = s.priority.parse::<Priority>() {
                return bad(format!("session {:?}: {e}", s.name));
            }
            if s.every == 0 {
                return bad(format!("session {:?}: every must be at least 1", s.name));
            }
            if s.max_tokens == Some(0) || self.max_tokens == 0 {
                return bad(format!(
                    "session {:?}: max_tokens must be at least 1",
                    s.name
                ));
            }
            if let Some(steps) = &s.steps {
                if steps.len() < s.turns.len() {
                    return bad(format!(
                        "session {:?}: {} turns but only {} steps",
                        s.name,
                        s.turns.len(),
                        steps.len()
                    ));
                }
                if steps.windows(2).any(|w| w[0] >= w[1]) {
                    return bad(format!("session {:?}: steps must increase", s.name));
                }
            }
        }
        Ok(())
    }

    /// The requests in order.
    pub fn schedule(&self) -> Vec<ScheduledTurn> {
        let mut out = Vec::new();
        let mut next = vec![0usize; self.sessions.len()];
        let mut step = 0usize;
        while self
            .sessions
            .iter()
            .zip(&next)
            .any(|(s, &n)| n < s.turns.len())
        {
            for (i, s) in self.sessions.iter().enumerate() {
                if next[i] >= s.turns.len() {
                    continue;
                }
                let speaks = match &s.steps {
                    Some(steps) => steps[next[i]] == step,
                    None => step >= s.start && (step - s.start).is_multiple_of(s.every),
                };
                if speaks {
                    out.push(ScheduledTurn {
                        step,
                        session: i,
                        turn: next[i],
                    });
                    next[i] += 1;
                }
            }
            step += 1;
        }
        out
    }

    /// The built-in workloads by name.
    pub fn preset(name: &str) -> Option<Workload> {
        match name {
            "mixed" => Some(mixed()),
            _ => None,
        }
    }
}

fn session(
    name: &str,
    priority: Priority,
    system: Option<&str>,
    steps: Option<Vec<usize>>,
    start: usize,
    every: usize,
    turns: &[&str],
) -> WorkloadSession {
    WorkloadSession {
        name: name.into(),
        priority: priority.name().into(),
        system: system.map(Into::into),
        salt: None,
        steps,
        start,
        every,
        max_tokens: None,
        temperature: 0.0,
        seed: 0,
        turns: turns.iter().map(|t| (*t).into()).collect(),
    }
}

fn mixed() -> Workload {
    const SERVICE: &str = "You are the intent checker of a small home computer. For every \
        request, say whether it is safe, what it touches, and what could go wrong. Be short, \
        precise and careful.";
    Workload {
        name: "mixed".into(),
        max_tokens: 16,
        step_seconds: 60.0,
        idle_threshold_seconds: 300.0,
        sessions: vec![
            // Speaks, goes quiet for 8 minutes (idle), comes back: evicted, then rebuilt.
            session(
                "chat-1",
                Priority::Interactive,
                None,
                Some(vec![0, 1, 2, 10]),
                0,
                1,
                &[
                    "Once upon a time there was a little cat.",
                    "What did the cat do next?",
                    "Did the cat find a friend?",
                    "How did the story end?",
                ],
            ),
            // Speaks every two minutes: always active, never evicted.
            session(
                "chat-2",
                Priority::Interactive,
                None,
                None,
                0,
                2,
                &[
                    "Tell me about a dog who loves the park.",
                    "Why does the dog like the park?",
                    "What happens when it rains?",
                    "Who does the dog meet there?",
                    "What does the dog eat?",
                    "Say goodbye to the dog.",
                ],
            ),
            session(
                "svc-1",
                Priority::System,
                Some(SERVICE),
                None,
                1,
                3,
                &[
                    "Request: open the kitchen window.",
                    "Request: send the photos to grandma.",
                    "Request: delete old downloads.",
                ],
            ),
            session(
                "svc-2",
                Priority::System,
                Some(SERVICE),
                None,
                2,
                3,
                &[
                    "Request: turn off the lights at night.",
                    "Request: play music in the garden.",
                    "Request: lock the front door.",
                ],
            ),
            session(
                "bg-1",
                Priority::Background,
                None,
                None,
                0,
                2,
                &[
                    "Summarize: the garden notes from spring.",
                    "Summarize: the shopping list for the week.",
                    "Summarize: the letters from the bank.",
                ],
            ),
            session(
                "bg-2",
                Priority::Background,
                None,
                None,
                1,
                2,
                &[
                    "Index: photos of the beach trip.",
                    "Index: recipes with apples.",
                    "Index: school reports.",
                ],
            ),
            session(
                "bg-3",
                Priority::Background,
                None,
                None,
                2,
                2,
                &[
                    "Tag: music files from the old laptop.",
                    "Tag: videos of the birthday party.",
                    "Tag: scanned receipts.",
                ],
            ),
            session(
                "bg-4",
                Priority::Background,
                None,
                None,
                3,
                2,
                &[
                    "Summarize: the notes from the meeting.",
                    "Summarize: the story the children wrote.",
                    "Summarize: the weather this month.",
                ],
            ),
        ],
    }
}

/// How to run a workload.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchConfig {
    /// The constrained pool's budget.
    pub pool_bytes: usize,
    pub tokens_per_block: u32,
    pub kv_type: KvType,
    pub step_tokens: usize,
    pub pin: PinPolicy,
    /// Also serve the workload from a pool that never evicts and compare every reply.
    pub verify: bool,
    /// The reference pool's budget (default: 16 × `pool_bytes`, at least 256 MiB of address
    /// space; pinned on fault, so it costs only what is written).
    pub reference_pool_bytes: Option<usize>,
    /// Speculative decoding of the scheduler under test (the reference decodes one token a
    /// step).
    pub draft: DraftConfig,
}

impl BenchConfig {
    pub fn new(pool_bytes: usize) -> BenchConfig {
        BenchConfig {
            pool_bytes,
            tokens_per_block: airs_memory::DEFAULT_TOKENS_PER_BLOCK,
            kv_type: KvType::F16,
            step_tokens: 512,
            pin: PinPolicy::default(),
            verify: false,
            reference_pool_bytes: None,
            draft: DraftConfig::OFF,
        }
    }
}

/// The outcome of one request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TurnRecord {
    pub step: usize,
    pub session: String,
    pub priority: String,
    pub turn: usize,
    /// The reply's token ids (empty on failure).
    pub tokens: Vec<u32>,
    pub text: String,
    /// The error, if the request failed.
    pub error: Option<String>,
    /// Positions of the session's history recomputed before the turn (its cache had been
    /// evicted), and times the turn itself was preempted.
    pub recomputed_tokens: usize,
    pub preemptions: u32,
}

/// The reply comparison with an unconstrained run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verification {
    pub compared: usize,
    pub identical: usize,
    /// `session turn`: the replies that differ.
    pub mismatches: Vec<String>,
    /// Evictions and preemptions in the reference run (must be 0 for the comparison to mean
    /// anything).
    pub reference_evictions: u64,
}

/// What `airs bench sessions` reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BenchReport {
    pub workload: String,
    pub model: String,
    pub sessions: usize,
    pub requests: usize,
    pub failed_requests: usize,
    pub pool_bytes: usize,
    pub block_bytes: usize,
    pub tokens_per_block: u32,
    pub blocks_total: u32,
    pub peak_blocks_used: u32,
    pub peak_used_bytes: usize,
    /// Session caches evicted (eviction steps) and running sequences preempted, by priority.
    pub evictions: PerPriority,
    pub preemptions: PerPriority,
    pub events_checked: usize,
    pub rebuilt_tokens: u64,
    pub prefill_tokens: u64,
    pub prefix_hit_tokens: u64,
    pub generated_tokens: u64,
    /// Draft tokens kept by speculative decoding ([`BenchConfig::draft`]).
    pub drafts_accepted: u64,
    pub steps: u64,
    /// Invariant violations (empty when all held).
    pub violations: Vec<String>,
    pub verification: Option<Verification>,
    pub elapsed_s: f64,
    pub damon_available: bool,
    /// The model pool's account at the end: weights, KV pool and scratch in one budget.
    pub model_pool: ModelPoolUsage,
    pub turns: Vec<TurnRecord>,
}

impl BenchReport {
    /// Whether every invariant held and, if verified, every reply matched.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
            && self
                .verification
                .as_ref()
                .is_none_or(|v| v.mismatches.is_empty() && v.reference_evictions == 0)
    }
}

/// What the sinks of one time step's turns collect.
type Outcomes = Arc<Mutex<BTreeMap<usize, TurnRecord>>>;

/// Serve `turns` of `workload` on `scheduler`, the turns of one time step together, checking
/// invariants after every scheduler step.
fn serve(
    scheduler: &mut Scheduler,
    clock: &ManualClock,
    workload: &Workload,
    turns: &[ScheduledTurn],
    violations: &mut Vec<String>,
    checked: &mut usize,
) -> Result<(Vec<TurnRecord>, u32)> {
    let threshold = scheduler.config().idle_threshold;
    let step_time = Duration::from_secs_f64(workload.step_seconds);
    let outcomes: Outcomes = Arc::new(Mutex::new(BTreeMap::new()));
    let mut peak = 0;
    let mut step = 0;
    let mut i = 0;
    while i < turns.len() {
        while step < turns[i].step {
            clock.advance(step_time);
            step += 1;
        }
        while i < turns.len() && turns[i].step == step {
            let t = &turns[i];
            let s = &workload.sessions[t.session];
            let priority: Priority = s.priority.parse().map_err(RuntimeError::invalid)?;
            let params = GenerationParams {
                max_tokens: s.max_tokens.unwrap_or(workload.max_tokens),
                sampler: SamplerConfig {
                    temperature: s.temperature,
                    seed: s.seed,
                    ..SamplerConfig::default()
                },
                ..GenerationParams::default()
            };
            let mut request =
                Request::turn(&s.name, &s.turns[t.turn], params).with_priority(priority);
            request.session = Some(SessionTurn {
                name: s.name.clone(),
                system: s.system.clone(),
            });
            request.salt = s.salt.as_ref().map(|x| x.as_bytes().to_vec());
            let record = TurnRecord {
                step: t.step,
                session: s.name.clone(),
                priority: s.priority.clone(),
                turn: t.turn,
                tokens: Vec::new(),
                text: String::new(),
                error: None,
                recomputed_tokens: 0,
                preemptions: 0,
            };
            outcomes.lock().unwrap().insert(i, record);
            let o = Arc::clone(&outcomes);
            let key = i;
            scheduler.submit(
                request,
                Box::new(move |event| {
                    let mut o = o.lock().unwrap();
                    let r = o.get_mut(&key).expect("recorded");
                    match event {
                        Event::ChoiceEnd(e) => {
                            r.tokens = e.tokens;
                            r.text = e.text;
                        }
                        Event::Done(d) => {
                            r.recomputed_tokens = d.rebuilt_tokens;
                            r.preemptions = d.preemptions;
                        }
                        Event::Failed(e) => r.error = Some(e.to_string()),
                        _ => {}
                    }
                    true
                }),
            )?;
            i += 1;
        }
        while scheduler.has_work() {
            let report = scheduler.step();
            for e in scheduler.take_events() {
                if matches!(e, SchedulerEvent::Exhausted(_)) {
                    continue;
                }
                *checked += 1;
                if let Err(v) = check_event(&e, threshold) {
                    violations.push(format!("step {step} (scheduler step {}): {v}", report.step));
                }
            }
            match check_pool(scheduler.kv_pool().memory()) {
                Ok(stats) => peak = peak.max(stats.blocks_used),
                Err(v) => violations.push(format!("step {step}: {v}")),
            }
            if let Err(v) = check_model_pool(scheduler.model().pool()) {
                violations.push(format!("step {step}: {v}"));
            }
        }
    }
    let records = std::mem::take(&mut *outcomes.lock().unwrap())
        .into_values()
        .collect();
    Ok((records, peak))
}

fn scheduler_for(
    model: &Arc<LoadedModel>,
    config: &BenchConfig,
    pool_bytes: usize,
    draft: DraftConfig,
    workload: &Workload,
    clock: &ManualClock,
) -> Result<Scheduler> {
    let mut sc = SchedulerConfig::new(pool_bytes);
    sc.draft = draft;
    sc.tokens_per_block = config.tokens_per_block;
    sc.kv_type = config.kv_type;
    sc.pin = config.pin;
    sc.step_tokens = config.step_tokens;
    sc.max_running = workload.sessions.len().max(1);
    sc.max_waiting = workload.sessions.len().max(64);
    sc.idle_threshold = Duration::from_secs_f64(workload.idle_threshold_seconds);
    Scheduler::with_clock(
        Arc::clone(model),
        sc,
        Some(HistoryStore::open_in_memory()?),
        Box::new(clock.clone()),
    )
}

/// Run `workload` on a scheduler over `model` with `config`'s pool; with `config.verify`, run
/// the requests that succeeded again on `reference` (the same model with an account of its
/// own: the oracle is not the system under test) with a pool that never evicts, and compare
/// the replies.
pub fn run_bench(
    model: &Arc<LoadedModel>,
    reference: Option<&Arc<LoadedModel>>,
    config: &BenchConfig,
    workload: &Workload,
) -> Result<BenchReport> {
    workload.validate()?;
    let clock = ManualClock::new();
    let mut scheduler = scheduler_for(
        model,
        config,
        config.pool_bytes,
        config.draft,
        workload,
        &clock,
    )?;
    let schedule = workload.schedule();
    let started = Instant::now();
    let mut violations = Vec::new();
    let mut checked = 0;
    let (records, peak) = serve(
        &mut scheduler,
        &clock,
        workload,
        &schedule,
        &mut violations,
        &mut checked,
    )?;
    let elapsed_s = started.elapsed().as_secs_f64();
    let stats = scheduler.stats().clone();

    let verification = if config.verify {
        let reference_model = reference.ok_or_else(|| {
            RuntimeError::invalid("verification needs a second model over the same file")
        })?;
        let ok: Vec<ScheduledTurn> = schedule
            .iter()
            .zip(&records)
            .filter(|(_, r)| r.error.is_none())
            .map(|(t, _)| t.clone())
            .collect();
        let bytes = config
            .reference_pool_bytes
            .unwrap_or_else(|| config.pool_bytes.saturating_mul(16).max(256 << 20));
        let clock = ManualClock::new();
        let mut reference = scheduler_for(
            reference_model,
            config,
            bytes,
            DraftConfig::OFF,
            workload,
            &clock,
        )?;
        let mut ref_violations = Vec::new();
        let mut ref_checked = 0;
        let (ref_records, _) = serve(
            &mut reference,
            &clock,
            workload,
            &ok,
            &mut ref_violations,
            &mut ref_checked,
        )?;
        let rs = reference.stats();
        let by_key: BTreeMap<(String, usize), &TurnRecord> = ref_records
            .iter()
            .map(|r| ((r.session.clone(), r.turn), r))
            .collect();
        let mut v = Verification {
            compared: 0,
            identical: 0,
            mismatches: Vec::new(),
            reference_evictions: rs.evictions.total() + rs.preemptions.total(),
        };
        for r in records.iter().filter(|r| r.error.is_none()) {
            v.compared += 1;
            match by_key.get(&(r.session.clone(), r.turn)) {
                Some(x) if x.tokens == r.tokens && x.error.is_none() => v.identical += 1,
                _ => v.mismatches.push(format!("{} turn {}", r.session, r.turn)),
            }
        }
        Some(v)
    } else {
        None
    };

    let pool = scheduler.kv_pool();
    let block_bytes = pool.block_bytes();
    Ok(BenchReport {
        workload: workload.name.clone(),
        model: model.model_key.clone(),
        sessions: workload.sessions.len(),
        requests: records.len(),
        failed_requests: records.iter().filter(|r| r.error.is_some()).count(),
        pool_bytes: config.pool_bytes,
        block_bytes,
        tokens_per_block: config.tokens_per_block,
        blocks_total: pool.memory().blocks_total(),
        peak_blocks_used: peak,
        peak_used_bytes: peak as usize * block_bytes,
        evictions: stats.evictions.clone(),
        preemptions: stats.preemptions.clone(),
        events_checked: checked,
        rebuilt_tokens: stats.rebuilt_tokens,
        prefill_tokens: stats.prefill_tokens,
        prefix_hit_tokens: stats.prefix_hit_tokens,
        generated_tokens: stats.generated_tokens,
        drafts_accepted: stats.drafts_accepted,
        steps: stats.steps,
        violations,
        verification,
        elapsed_s,
        damon_available: crate::idle::damon_available(),
        model_pool: model.pool().usage().into(),
        turns: records,
    })
}

impl std::fmt::Display for BenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "workload {}: {} sessions, {} requests ({} failed), {} steps, {:.2} s, model {}",
            self.workload,
            self.sessions,
            self.requests,
            self.failed_requests,
            self.steps,
            self.elapsed_s,
            self.model
        )?;
        writeln!(
            f,
            "pool: {} bytes = {} blocks of {} bytes ({} tokens each); peak {} blocks used ({} bytes)",
            self.pool_bytes,
            self.blocks_total,
            self.block_bytes,
            self.tokens_per_block,
            self.peak_blocks_used,
            self.peak_used_bytes
        )?;
        let mp = &self.model_pool;
        if mp.capacity_bytes != u64::MAX {
            writeln!(
                f,
                "model pool: {} bytes = weights {} + KV pool {} + scratch {} + free {}",
                mp.capacity_bytes,
                mp.weights_bytes,
                mp.kv_cache_bytes,
                mp.scratch_bytes,
                mp.free_bytes
            )?;
        }
        writeln!(
            f,
            "{:<13} {:>16} {:>12}",
            "", "cache evictions", "preemptions"
        )?;
        for p in [
            Priority::Background,
            Priority::System,
            Priority::Interactive,
        ] {
            writeln!(
                f,
                "  {:<11} {:>16} {:>12}",
                p.name(),
                self.evictions.get(p),
                self.preemptions.get(p)
            )?;
        }
        writeln!(
            f,
            "rebuilt {} tokens; prefill {} tokens, prefix hits {} tokens, generated {} tokens",
            self.rebuilt_tokens, self.prefill_tokens, self.prefix_hit_tokens, self.generated_tokens
        )?;
        if self.violations.is_empty() {
            writeln!(
                f,
                "invariants: ok over {} requests and {} memory events (budget never exceeded, \
                 no active interactive session or running interactive request evicted, order \
                 background → system → idle interactive, LRU within a level)",
                self.requests, self.events_checked
            )?;
        } else {
            writeln!(f, "invariants: {} VIOLATIONS", self.violations.len())?;
            for v in &self.violations {
                writeln!(f, "  {v}")?;
            }
        }
        for r in self.turns.iter().filter(|r| r.error.is_some()) {
            writeln!(
                f,
                "failed: step {} {} turn {}: {}",
                r.step,
                r.session,
                r.turn,
                r.error.as_deref().unwrap_or("")
            )?;
        }
        if let Some(v) = &self.verification {
            if v.mismatches.is_empty() && v.reference_evictions == 0 {
                writeln!(
                    f,
                    "verify: {}/{} replies identical to a run that never evicts",
                    v.identical, v.compared
                )?;
            } else {
                writeln!(
                    f,
                    "verify: {}/{} identical; differ: {:?}; reference evictions: {}",
                    v.identical, v.compared, v.mismatches, v.reference_evictions
                )?;
            }
        }
        writeln!(
            f,
            "damon: {}",
            if self.damon_available {
                "available (telemetry only)"
            } else {
                "not available (idleness is tracked by the runtime)"
            }
        )
    }
}
