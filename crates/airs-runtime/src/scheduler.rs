//! The scheduler: continuous batching of many requests over one model and one paged KV pool,
//! with priorities, preemption by recomputation, prefix sharing and persistent sessions.
//!
//! Design: vLLM V1's scheduler (`core/sched/scheduler.py`: a token budget per step shared by
//! decode tokens and prefill chunks — chunked prefill, as Sarathi-Serve — requests joining and
//! leaving the running batch at every step, recompute preemption) with SGLang's radix prefix
//! reuse at admission, and the priorities and eviction order of §6.3 of the model-memory
//! chapter (background, then system, then idle interactive; an active interactive request is
//! never preempted).
//!
//! A step ([`Scheduler::step`]):
//! 1. every running sequence that is decoding gets its one token (they are cheap, and a long
//!    prompt must never stall them), most important first;
//! 2. running sequences still prefilling get chunks of what is left of the step's token budget
//!    ([`SchedulerConfig::step_tokens`], 512 by default), most important first;
//! 3. waiting requests are admitted while a slot ([`SchedulerConfig::max_running`]) and budget
//!    remain, most important first; admission reserves blocks for the whole prompt;
//! 4. with speculative decoding ([`SchedulerConfig::draft`]), decoding sequences also get
//!    draft tokens looked up in their own context ([`crate::lookup`]) in what is left of the
//!    step, as many as their measured cost pays for ([`crate::draft_cost`]), taking only free
//!    blocks;
//! 5. one batched forward pass ([`airs_engine::Model::forward_batch`]) computes every scheduled
//!    row, reading each weight matrix once; the logits of every sequence that reached the end
//!    of its pending tokens are sampled ([`crate::generation`]) and streamed to its request
//!    (a speculating sequence's rows in order, while the token drawn is the next draft; the
//!    positions of the drafts rejected are forgotten).
//!
//! "Most important first" is: sequences that have waited [`SchedulerConfig::starvation_steps`]
//! steps without being scheduled, then priority (interactive, system, background), then arrival.
//!
//! Memory: when a sequence needs blocks the pool does not have (free or cached), blocks are
//! taken back in the design's order — cached session KV between turns and running sequences
//! of a *strictly lower* priority, background before system before idle interactive; within a
//! level, session caches least recently used first (their ends first), then running sequences
//! latest-arrived first. A preempted sequence loses its KV and goes back to the queue with its
//! tokens (prompt and generated so far), to be recomputed when it is readmitted: the kernels
//! are batch-invariant, so its continuation is exactly what it would have been. What cannot be
//! freed that way:
//! - a system or background sequence gives way itself: the latest-arrived running sequence of
//!   its own priority (possibly itself) is preempted;
//! - an interactive sequence waits (it is never preempted) while other sequences make progress
//!   and free blocks; if no sequence can make progress at all, the latest-arrived of them fails
//!   with [`RuntimeErrorKind::PoolExhausted`];
//! - a waiting request stays queued while what it needs is held by running sequences (they
//!   finish or are preempted); it fails at once with `PoolExhausted`, naming the holders, when
//!   its prompt is larger than the pool minus the protected session caches (active interactive
//!   sessions), or larger than the whole pool.
//!
//! A sequence that is not a session's turn is as long as the pool can ever hold it: a choice
//! that reaches the pool's positions ends there with `ContextFull` (OpenAI's `length`), its
//! text kept, as at the model's context length, rather than stall and fail with
//! `PoolExhausted` after all its generation. (A session's turn fails instead, so that no
//! reply cut short enters its history.)
//!
//! Starvation bound: a running sequence that is decoding is scheduled at every step it has its
//! next block for (`step_tokens` must exceed `max_running`, so decode rows never take the whole
//! budget). A *runnable* sequence — a running one still prefilling, or a waiting one for which
//! a slot and its blocks are free — is scheduled within `starvation_steps + max_running` steps
//! (32 by default): after `starvation_steps` steps without progress it is served before every
//! sequence that is not starving, even a more important request that waits for memory, and
//! starving sequences are served one after another. Only a sequence whose blocks the pool
//! cannot hold (or that has no slot) waits longer, which is what "runnable" excludes.
//!
//! Prefix sharing: at admission a request takes the longest prefix of its tokens the pool's
//! radix index holds ([`airs_engine::PagedKv::new_sequence_with_prefix`]). If a running
//! sequence with the same salt is still computing a longer common prefix (whole blocks), the
//! request waits for it instead of computing the same blocks again — requests that arrive
//! together with a shared system prompt compute it once. The `n` choices of a request share its
//! prompt's blocks: the first choice prefills, the others fork its block table (copy-on-write)
//! when its prompt is done and sample from the same logits with their own seeds.
//!
//! Sessions ([`crate::sessions`]): a request with a [`crate::request::SessionTurn`] appends its new
//! messages (a user message, or the results of the functions the last reply called) and the reply
//! to a persistent conversation, rendered with the session's tools if it has any. It is admitted
//! when the session has no other turn in flight; it starts from the session's cached KV if eviction
//! left it whole, else from the prefix index (what survived), and recomputes the rest. The turn is
//! committed to the history store before [`Event::Done`] is sent.
//!
//! Cancellation ([`Scheduler::cancel`], or a sink that reports its receiver gone) frees the
//! request's blocks at once; a cancelled session turn commits nothing.
//!
//! Cost per step: one forward pass over the scheduled rows; sorting the running and waiting
//! sequences (O(n log n)); an eviction plan when blocks run out (O(holders log holders +
//! blocks)). Memory: the KV pool (charged to the model pool at creation) and the scratch of a
//! step (charged too), plus per sequence its token ids.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airs_engine::forward::LAYER_MAJOR_PASSES;
use airs_engine::{BatchOutput, BatchSeq, KvType, Output, PagedKv, PagedKvConfig, PagedKvPool};
use airs_memory::eviction::{
    EvictionClass, EvictionPolicy, Priority, Protection, SessionDescriptor, SessionId,
};
use airs_memory::{BlockId, PinPolicy, PoolCharge, PoolUse};
use serde::Serialize;

use crate::draft_cost::{self, Acceptance, Candidate, StepCost, StepTimeFit};
use crate::error::{Holder, PoolExhausted, PoolTooSmall, Result, RuntimeError, RuntimeErrorKind};
use crate::generation::{Draw, Generation};
use crate::idle::{Clock, SystemClock};
use crate::lookup::{self, DraftConfig, DraftCost};
use crate::metrics::SchedulerStats;
use crate::model::LoadedModel;
use crate::request::{
    ChoiceEnd, Completion, Embedding, Event, GenerationParams, Prompt, Request, RequestId, Task,
    TokenEvent, Usage,
};
use crate::sessions::Sessions;
use crate::store::{HistoryStore, Role};
use crate::tools::Tools;

/// Where a request's events go: called with each event; returns `false` once nobody listens
/// (the request is then cancelled).
pub type Sink = Box<dyn FnMut(Event) -> bool + Send>;

/// How a [`Scheduler`] is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// The KV pool's byte budget (all sequences together), charged to the model pool.
    pub kv_pool_bytes: usize,
    pub kv_type: KvType,
    /// Positions per KV block.
    pub tokens_per_block: u32,
    pub pin: PinPolicy,
    /// The KV pool on transparent huge pages (`airs_memory::KvPoolConfig::huge_pages`).
    pub kv_huge_pages: bool,
    /// Most rows (decode tokens plus prefill chunks) one step computes.
    pub step_tokens: usize,
    /// Most sequences running at once (decoding or prefilling).
    pub max_running: usize,
    /// Most requests waiting; more are refused with [`RuntimeErrorKind::QueueFull`].
    pub max_waiting: usize,
    /// Interactive session caches idle for longer than this may be evicted.
    pub idle_threshold: Duration,
    /// Steps without progress after which a runnable sequence is served first.
    pub starvation_steps: u64,
    /// Speculative decoding with drafts by prompt lookup ([`crate::lookup`]); off by default.
    pub draft: DraftConfig,
}

impl SchedulerConfig {
    /// A KV pool of `kv_pool_bytes` with the defaults: f16 KV in 16-position blocks pinned on
    /// fault, 512-token steps, 16 running and 64 waiting sequences, a 5-minute idle threshold,
    /// 16 steps of starvation bound.
    pub fn new(kv_pool_bytes: usize) -> SchedulerConfig {
        SchedulerConfig {
            kv_pool_bytes,
            kv_type: KvType::F16,
            tokens_per_block: airs_memory::DEFAULT_TOKENS_PER_BLOCK,
            pin: PinPolicy::default(),
            kv_huge_pages: true,
            step_tokens: 512,
            max_running: 16,
            max_waiting: 64,
            idle_threshold: EvictionPolicy::DEFAULT_IDLE_THRESHOLD,
            starvation_steps: 16,
            draft: DraftConfig::OFF,
        }
    }
}

/// A sequence's slot in the scheduler (one choice of one request).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct SeqId(pub u32);

/// Why a waiting sequence was not admitted in a step.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitReason {
    /// Every running slot is taken.
    NoSlot,
    /// The step's token budget is spent.
    NoBudget,
    /// Its blocks are held by running sequences.
    NoMemory,
    /// A more important request before it could not be admitted (strict priority order).
    Behind,
    /// A running sequence is computing a prefix it shares.
    PrefixInFlight,
    /// Its session has another turn in flight.
    SessionBusy,
}

/// What one step did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StepReport {
    pub step: u64,
    /// Rows computed: decode tokens and prefill tokens.
    pub decode_rows: usize,
    pub prefill_rows: usize,
    /// The sequences scheduled, with their rows.
    pub scheduled: Vec<(SeqId, RequestId, usize)>,
    /// Sequences admitted this step.
    pub admitted: Vec<SeqId>,
    /// Running sequences that could not get their blocks this step.
    pub stalled: Vec<SeqId>,
    /// Waiting sequences not admitted, and why.
    pub waiting: Vec<(SeqId, WaitReason)>,
    /// Draft tokens computed beside decode rows (counted in neither of the above), and those
    /// the verification kept.
    pub draft_rows: usize,
    pub drafts_accepted: usize,
    /// Forward-pass time.
    #[serde(skip)]
    pub forward_time: Duration,
}

impl StepReport {
    pub fn rows(&self) -> usize {
        self.decode_rows + self.prefill_rows + self.draft_rows
    }
}

/// A memory event, for tests and benchmarks to check the policy with ([`crate::invariants`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchedulerEvent {
    /// A running sequence was preempted for `requester`.
    Preempted {
        at: Duration,
        step: u64,
        victim: SeqId,
        priority: Priority,
        requester: SeqId,
        requester_priority: Priority,
        blocks: u32,
    },
    /// A session's cache was truncated to `blocks_after` blocks for `requester`.
    CacheEvicted {
        at: Duration,
        session: SessionId,
        class: EvictionClass,
        priority: Priority,
        requester: SeqId,
        blocks_before: u32,
        blocks_after: u32,
        /// Blocks that became available in the pool (free or reclaimable) by this step.
        blocks_freed: u32,
        /// Every session cache (not in a turn) holding blocks just before, for ordering checks:
        /// `(session, priority, last access, blocks)`.
        caches: Vec<(SessionId, Priority, Duration, u32)>,
    },
    /// A request failed for lack of KV memory.
    Exhausted(PoolExhausted),
}

/// The pool's blocks as one map, for the pool page and `/v1/pool`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PoolMap {
    pub tokens_per_block: u32,
    pub block_bytes: usize,
    pub blocks_total: u32,
    pub blocks_used: u32,
    pub blocks_cached: u32,
    pub blocks_free: u32,
    /// Every holder of blocks: a running request's choice or a session's cache.
    pub holders: Vec<BlockHolder>,
    /// Blocks referenced by more than one holder (shared prefixes), ascending.
    pub shared_blocks: Vec<u32>,
}

/// One holder in a [`PoolMap`].
#[derive(Clone, Debug, Serialize)]
pub struct BlockHolder {
    /// `req-N/choice` or the session's name.
    pub name: String,
    pub kind: &'static str,
    pub priority: &'static str,
    pub running: bool,
    pub tokens: usize,
    pub blocks: Vec<u32>,
}

/// Per request.
struct Req {
    sink: Sink,
    task: Task,
    /// Choices: the first is created at submission, the others when its prompt is done.
    seqs: Vec<SeqId>,
    open_choices: usize,
    n: usize,
    forked: bool,
    /// A session turn: its name and system message until resolved at admission.
    turn: Option<TurnState>,
    usage: Usage,
    submitted: Instant,
    admitted: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    decode_tokens: usize,
    preemptions: u32,
    /// Positions recomputed that had been computed before (evicted or preempted).
    rebuilt_tokens: usize,
    /// The sink reported its receiver gone.
    gone: bool,
}

struct TurnState {
    name: String,
    system: Option<String>,
    /// The turn's new messages: user messages, or the results of the functions the last
    /// reply called.
    inputs: Vec<(Role, String)>,
    /// The tools the request names (the session's own, or its first turn's).
    tools: Option<Arc<Tools>>,
    /// Set at admission: the session and the tokens the turn appends.
    resolved: Option<(SessionId, Vec<u32>)>,
    /// Positions of the session's history computed before the turn (what a rebuild
    /// recomputes is below this).
    history_computed: usize,
}

/// Per sequence (one choice).
struct Seq {
    request: RequestId,
    choice: usize,
    priority: Priority,
    salt: Option<Vec<u8>>,
    /// Every token: prompt, then generated. Empty until a session turn is resolved.
    tokens: Vec<u32>,
    prompt_len: usize,
    kv: Option<PagedKv>,
    generation: Option<Generation>,
    /// Embedding requests: the sum of the final hidden rows so far.
    embed: Option<Vec<f64>>,
    /// Arrival order (ties broken by it everywhere).
    arrival: u64,
    /// The step it last made progress in (or entered its state).
    since: u64,
    /// Most positions it ever had computed (what a rebuild recomputes is below this).
    computed_high: usize,
    running: bool,
    admitted_once: bool,
    /// Set from planning a step that computes drafts until its verification settles.
    speculation: Option<Speculation>,
    /// Its drafts put to the model and kept ([`crate::draft_cost`]).
    acceptance: Acceptance,
}

/// A decode step that also computes draft tokens ([`crate::lookup`]).
struct Speculation {
    /// Position of the pending token.
    base: usize,
    /// The pending token, then the drafts: what the step computes at `base..`.
    rows: Vec<u32>,
}

impl Seq {
    fn kv_len(&self) -> usize {
        self.kv.as_ref().map_or(0, |kv| kv.table().len())
    }

    fn pending(&self) -> usize {
        self.tokens.len() - self.kv_len()
    }

    fn blocks(&self) -> &[BlockId] {
        self.kv.as_ref().map_or(&[], |kv| kv.table().blocks())
    }

    /// After a step with drafts: forget the KV positions of drafts that did not become the
    /// sequence's tokens (its cache then holds exactly positions whose tokens it has).
    fn settle_drafts(&mut self) {
        let Some(spec) = self.speculation.take() else {
            return;
        };
        let agreed = spec
            .rows
            .iter()
            .zip(&self.tokens[spec.base..])
            .take_while(|(a, b)| a == b)
            .count();
        if let Some(kv) = self.kv.as_mut() {
            kv.truncate(spec.base + agreed);
        }
    }
}

/// A holder the eviction plan may take blocks from.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Victim {
    /// Truncate a session's cache to its first `keep` blocks.
    Cache { session: SessionId, keep: u32 },
    /// Preempt a running sequence.
    Seq(SeqId),
}

/// A row group of the step being planned.
#[derive(Copy, Clone, Debug)]
struct Planned {
    seq: SeqId,
    rows: usize,
    output: Output,
}

/// Rank of a priority for ordering (interactive first).
fn rank(p: Priority) -> u8 {
    match p {
        Priority::Interactive => 0,
        Priority::System => 1,
        Priority::Background => 2,
    }
}

fn class_priority(c: EvictionClass) -> Priority {
    match c {
        EvictionClass::Background => Priority::Background,
        EvictionClass::System => Priority::System,
        EvictionClass::IdleInteractive => Priority::Interactive,
    }
}

/// The scheduler (see the module documentation).
pub struct Scheduler {
    model: Arc<LoadedModel>,
    pool: PagedKvPool,
    config: SchedulerConfig,
    policy: EvictionPolicy,
    clock: Box<dyn Clock>,
    sessions: Option<Sessions>,
    requests: BTreeMap<RequestId, Req>,
    seqs: Vec<Option<Seq>>,
    free_slots: Vec<u32>,
    waiting: Vec<SeqId>,
    running: Vec<SeqId>,
    next_request: u64,
    next_arrival: u64,
    step_no: u64,
    stats: SchedulerStats,
    events: Vec<SchedulerEvent>,
    /// The scratch's share of the model pool (the KV pool holds its own charge).
    _scratch: PoolCharge,
    /// The last step's outputs, whose buffer the next step's logits are written over (part of
    /// the step scratch charged above).
    step_out: BatchOutput,
    /// What a step costs in time against its rows, and how often drafts are kept overall
    /// ([`crate::draft_cost`]).
    step_times: StepTimeFit,
    acceptance: Acceptance,
    /// Steps in a row that had draft proposals and computed none.
    draftless_steps: u32,
    /// Time this step spent committing session turns, which the step-time fit leaves out (a
    /// slow disk is not what a row costs).
    commit_time: Duration,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("model", &self.model.name)
            .field("running", &self.running.len())
            .field("waiting", &self.waiting.len())
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// A scheduler for `model` with a KV pool of `config.kv_pool_bytes`, its sessions (if any)
    /// in `store`. The KV pool and the scratch of a step are charged to the model pool that
    /// holds the weights first: a scheduler the pool cannot hold fails here, naming what holds
    /// it.
    pub fn new(
        model: Arc<LoadedModel>,
        config: SchedulerConfig,
        store: Option<HistoryStore>,
    ) -> Result<Scheduler> {
        Scheduler::with_clock(model, config, store, Box::new(SystemClock::new()))
    }

    /// [`Scheduler::new`] with a given clock (e.g. [`crate::ManualClock`]) for idleness.
    pub fn with_clock(
        model: Arc<LoadedModel>,
        config: SchedulerConfig,
        store: Option<HistoryStore>,
        clock: Box<dyn Clock>,
    ) -> Result<Scheduler> {
        if config.max_running == 0 || config.step_tokens <= config.max_running {
            return Err(RuntimeError::invalid(
                "max_running must be at least 1 and step_tokens larger than max_running",
            ));
        }
        let shape = model.kv_shape();
        let charges = crate::fit::scheduler_charges(
            &model.shape,
            &config,
            model.runtime.pool.threads() as u64,
        )?;
        let scratch_bytes = charges.scratch.total();
        let scratch = model
            .pool()
            .charge(
                PoolUse::Scratch,
                scratch_bytes,
                format!("forward steps of {}", model.name),
            )
            .map_err(|e| RuntimeError::new(RuntimeErrorKind::PoolFull(e)))?;
        let pool = PagedKvPool::new_charged(
            shape,
            config.kv_type,
            &PagedKvConfig {
                pool_bytes: config.kv_pool_bytes,
                tokens_per_block: config.tokens_per_block,
                pin: config.pin,
                huge_pages: config.kv_huge_pages,
            },
            model.pool(),
        )?;
        let policy = EvictionPolicy {
            idle_threshold: config.idle_threshold,
            tokens_per_block: config.tokens_per_block,
        };
        let sessions = store.map(|s| Sessions::new(s, model.model_key.clone()));
        Ok(Scheduler {
            model,
            pool,
            config,
            policy,
            clock,
            sessions,
            requests: BTreeMap::new(),
            seqs: Vec::new(),
            free_slots: Vec::new(),
            waiting: Vec::new(),
            running: Vec::new(),
            next_request: 0,
            next_arrival: 0,
            step_no: 0,
            stats: SchedulerStats::default(),
            events: Vec::new(),
            _scratch: scratch,
            step_out: BatchOutput::default(),
            step_times: StepTimeFit::default(),
            acceptance: Acceptance::INITIAL,
            draftless_steps: 0,
            commit_time: Duration::ZERO,
        })
    }

    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.model
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The KV pool (statistics, audits).
    pub fn kv_pool(&self) -> &PagedKvPool {
        &self.pool
    }

    pub fn stats(&self) -> &SchedulerStats {
        &self.stats
    }

    /// The time on the scheduler's clock.
    pub fn now(&self) -> Duration {
        self.clock.now()
    }

    /// Memory events since the last call.
    pub fn take_events(&mut self) -> Vec<SchedulerEvent> {
        std::mem::take(&mut self.events)
    }

    /// Sequences running and requests waiting.
    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether any request is in flight.
    pub fn has_work(&self) -> bool {
        !self.requests.is_empty()
    }

    /// The history store, if the scheduler serves sessions.
    pub fn store(&self) -> Option<&HistoryStore> {
        self.sessions.as_ref().map(|s| &s.store)
    }

    #[track_caller]
    fn seq(&self, id: SeqId) -> &Seq {
        self.seqs[id.0 as usize].as_ref().expect("live sequence")
    }

    #[track_caller]
    fn seq_mut(&mut self, id: SeqId) -> &mut Seq {
        self.seqs[id.0 as usize].as_mut().expect("live sequence")
    }

    fn new_seq(&mut self, seq: Seq) -> SeqId {
        match self.free_slots.pop() {
            Some(i) => {
                self.seqs[i as usize] = Some(seq);
                SeqId(i)
            }
            None => {
                self.seqs.push(Some(seq));
                SeqId(self.seqs.len() as u32 - 1)
            }
        }
    }

    fn remove_seq(&mut self, id: SeqId) -> Seq {
        self.running.retain(|&s| s != id);
        self.waiting.retain(|&s| s != id);
        self.free_slots.push(id.0);
        self.seqs[id.0 as usize].take().expect("live sequence")
    }

    /// Remove request `request`'s sequences among `seqs` that are still live. A slot of a
    /// choice that already ended may hold another request's sequence by now, so a slot counts
    /// only while its sequence belongs to `request`.
    fn remove_seqs_of(&mut self, request: RequestId, seqs: &[SeqId]) {
        for &s in seqs {
            let ours = self
                .seqs
                .get(s.0 as usize)
                .is_some_and(|x| x.as_ref().is_some_and(|q| q.request == request));
            if ours {
                drop(self.remove_seq(s));
            }
        }
    }

    fn blocks_for(&self, positions: usize) -> u32 {
        positions.div_ceil(self.config.tokens_per_block as usize) as u32
    }

    /// `Some` when `positions` need more blocks than the whole pool has: no eviction or
    /// finished request can ever make room for them.
    fn pool_too_small(&self, positions: usize) -> Option<PoolTooSmall> {
        let total = self.pool.memory().blocks_total();
        (self.blocks_for(positions) > total).then(|| PoolTooSmall {
            needed_tokens: positions,
            pool_tokens: total as usize * self.pool.tokens_per_block(),
        })
    }

    // -----------------------------------------------------------------------------------------
    // Submission and cancellation.

    /// Queue `request`; its events go to `sink`. A request that is wrong (empty or too long a
    /// prompt, bad parameters), larger than the whole pool, or beyond the queue's bound is
    /// refused here with the typed error (and nothing is sent to `sink`); any later failure is
    /// sent as [`Event::Failed`].
    pub fn submit(&mut self, request: Request, sink: Sink) -> Result<RequestId> {
        let id = RequestId(self.next_request);
        self.submit_as(id, request, sink).map_err(|r| r.error)?;
        Ok(id)
    }

    /// [`Scheduler::submit`] under an id chosen by the caller (the engine thread numbers
    /// requests before they reach the scheduler); a refusal hands the sink back with the error.
    pub fn submit_as(
        &mut self,
        id: RequestId,
        request: Request,
        sink: Sink,
    ) -> std::result::Result<(), Refused> {
        if self.requests.contains_key(&id) {
            let error = RuntimeError::invalid(format!("request id {id} is in use"));
            return Err(Refused { error, sink });
        }
        match self.accept(id, request) {
            Ok(req) => {
                self.requests.insert(id, Req { sink, ..req });
                self.stats.requests += 1;
                Ok(())
            }
            Err(error) => {
                self.stats.rejected += 1;
                Err(Refused { error, sink })
            }
        }
    }

    /// Fail every request in flight with `error()`; returns how many.
    pub fn fail_all(&mut self, error: impl Fn() -> RuntimeError) -> u64 {
        let ids: Vec<RequestId> = self.requests.keys().copied().collect();
        for &id in &ids {
            if let Some(mut req) = self.end_request(id) {
                self.stats.cancelled += 1;
                let _ = (req.sink)(Event::Failed(error()));
            }
        }
        ids.len() as u64
    }

    /// Validate `request` and queue its first sequence; returns its state (with a
    /// placeholder sink).
    fn accept(&mut self, id: RequestId, request: Request) -> Result<Req> {
        let waiting_requests = self
            .waiting
            .iter()
            .filter(|&&s| !self.seq(s).admitted_once)
            .count();
        if waiting_requests >= self.config.max_waiting {
            return Err(RuntimeError::new(RuntimeErrorKind::QueueFull {
                limit: self.config.max_waiting,
            }));
        }
        let Request {
            prompt,
            task,
            priority,
            session,
            salt,
        } = request;
        let n = match &task {
            Task::Generate(p) => {
                validate_params(p)?;
                p.n
            }
            Task::Embed => 1,
        };
        let context_len = self.model.context_len();
        let (tokens, turn) = match session {
            Some(turn) => {
                if self.sessions.is_none() {
                    return Err(RuntimeError::invalid(
                        "sessions need a history store (none is configured)",
                    ));
                }
                if n > 1 || task == Task::Embed {
                    return Err(RuntimeError::invalid(
                        "a session turn generates one choice (n = 1) and no embedding",
                    ));
                }
                let (messages, tools) = match prompt {
                    Prompt::Chat(m) => (m, None),
                    Prompt::ChatWithTools { messages, tools } => (messages, Some(tools)),
                    _ => (Vec::new(), None),
                };
                let inputs: Option<Vec<(Role, String)>> = messages
                    .into_iter()
                    .map(|m| match m.role.as_str() {
                        "user" => Some((Role::User, m.content)),
                        "tool" => Some((Role::Tool, m.content)),
                        _ => None,
                    })
                    .collect();
                let inputs = match inputs {
                    Some(inputs) if !inputs.is_empty() => inputs,
                    _ => {
                        return Err(RuntimeError::invalid(
                            "a session turn sends only its new messages: user messages, or the \
                             results of the functions the last reply called",
                        ));
                    }
                };
                let state = TurnState {
                    name: turn.name,
                    system: turn.system,
                    inputs,
                    tools,
                    resolved: None,
                    history_computed: 0,
                };
                (Vec::new(), Some(state))
            }
            None => {
                let tokens = self.model.prompt_tokens(prompt)?;
                let vocab = self.model.model.config.vocab_len;
                if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
                    return Err(RuntimeError::invalid(format!(
                        "token id {bad} is outside the vocabulary of {vocab}"
                    )));
                }
                if tokens.is_empty() {
                    return Err(RuntimeError::invalid(
                        "the prompt is empty and the model has no BOS token to start from",
                    ));
                }
                // Generation needs a position after the prompt; an embedding only the prompt.
                let room = usize::from(task != Task::Embed);
                if tokens.len() + room > context_len {
                    return Err(RuntimeError::new(RuntimeErrorKind::ContextFull {
                        needed: tokens.len() + room,
                        context_len,
                    }));
                }
                let total = self.pool.memory().blocks_total();
                let need = self.blocks_for(tokens.len() + room);
                if need > total {
                    let e = airs_memory::PoolExhausted {
                        needed_blocks: need,
                        available_blocks: total,
                        blocks_total: total,
                        block_bytes: self.pool.block_bytes(),
                        pool_bytes: self.config.kv_pool_bytes,
                    };
                    let mut report =
                        self.exhausted_report(format!("a prompt of {}", tokens.len()), e, None);
                    report.exceeds_pool = self.pool_too_small(tokens.len() + room);
                    return Err(RuntimeError::new(RuntimeErrorKind::PoolExhausted(
                        Box::new(report),
                    )));
                }
                (tokens, None)
            }
        };
        self.next_request = self.next_request.max(id.0 + 1);
        let generation = match &task {
            Task::Generate(p) => Some(Generation::new(p, 0, &self.model)),
            Task::Embed => None,
        };
        let prompt_len = tokens.len();
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        let seq = self.new_seq(Seq {
            request: id,
            choice: 0,
            priority,
            salt,
            tokens,
            prompt_len,
            kv: None,
            generation,
            embed: (task == Task::Embed).then(|| vec![0.0; self.model.model.config.embedding_len]),
            arrival,
            since: self.step_no,
            computed_high: 0,
            running: false,
            admitted_once: false,
            speculation: None,
            acceptance: Acceptance::default(),
        });
        self.waiting.push(seq);
        Ok(Req {
            sink: Box::new(|_| true),
            task,
            seqs: vec![seq],
            open_choices: 1,
            n,
            forked: false,
            turn,
            usage: Usage {
                prompt_tokens: prompt_len,
                ..Usage::default()
            },
            submitted: Instant::now(),
            admitted: None,
            first_token: None,
            last_token: None,
            decode_tokens: 0,
            preemptions: 0,
            rebuilt_tokens: 0,
            gone: false,
        })
    }

    /// Cancel request `id`: its sequences' blocks return to the pool at once; a session turn
    /// commits nothing (the session's cache is dropped: its blocks stay in the prefix index
    /// for the next turn). Unknown (finished) requests are ignored.
    pub fn cancel(&mut self, id: RequestId) {
        if self.end_request(id).is_some() {
            self.stats.cancelled += 1;
        }
    }

    /// Remove a request and everything it holds; returns it.
    fn end_request(&mut self, id: RequestId) -> Option<Req> {
        let req = self.requests.remove(&id)?;
        self.remove_seqs_of(id, &req.seqs);
        if let (Some(turn), Some(sessions)) = (&req.turn, self.sessions.as_mut())
            && let Some((sid, _)) = turn.resolved
            && let Some(s) = sessions.open.get_mut(&sid)
            && s.busy == Some(id)
        {
            s.busy = None;
            s.kv = None;
        }
        Some(req)
    }

    fn fail(&mut self, id: RequestId, error: RuntimeError) {
        if let Some(p) = error.pool_exhausted() {
            self.stats.exhausted += 1;
            self.events.push(SchedulerEvent::Exhausted(p.clone()));
        }
        if let Some(mut req) = self.end_request(id) {
            self.stats.failed += 1;
            let _ = (req.sink)(Event::Failed(error));
        }
    }

    fn emit(&mut self, id: RequestId, event: Event) {
        if let Some(req) = self.requests.get_mut(&id)
            && !(req.sink)(event)
        {
            req.gone = true;
        }
    }

    // -----------------------------------------------------------------------------------------
    // The step.

    /// The order sequences are served in: starving first, then priority, then arrival.
    fn order_key(&self, id: SeqId) -> (bool, u8, u64) {
        let s = self.seq(id);
        let starving = self.step_no.saturating_sub(s.since) >= self.config.starvation_steps;
        (!starving, rank(s.priority), s.arrival)
    }

    /// Run one step (see the module documentation). Does nothing when no request is in
    /// flight.
    pub fn step(&mut self) -> StepReport {
        self.step_no += 1;
        let mut report = StepReport {
            step: self.step_no,
            ..StepReport::default()
        };
        if self.requests.is_empty() {
            return report;
        }
        // While the weights load, a prompt may take several passes in one step: they run
        // layer-major, so all of them overlap the load.
        let started = Instant::now();
        self.commit_time = Duration::ZERO;
        let loading = self.model.is_loading();
        let mut budget = self.config.step_tokens * if loading { LAYER_MAJOR_PASSES } else { 1 };
        let mut plan: Vec<Planned> = Vec::new();

        let mut running = self.running.clone();
        running.sort_by_key(|&id| self.order_key(id));
        for decode in [true, false] {
            for &id in &running {
                if budget == 0 {
                    break;
                }
                let Some(seq) = self.seqs[id.0 as usize].as_ref() else {
                    continue;
                };
                let pending = seq.pending();
                if !seq.running || pending == 0 || (pending == 1) != decode {
                    continue;
                }
                let rows = pending.min(budget);
                if self.reserve(id, rows, &mut plan, &mut budget, &mut report) {
                    plan.push(self.planned(id, rows));
                    budget -= rows;
                }
            }
        }
        self.admit(&mut plan, &mut budget, &mut report);
        // A step of decode rows alone (before drafts): what the step-time fit observes.
        let decode_only = plan
            .iter()
            .all(|p| p.rows == 1 && p.output == Output::LastLogits);
        self.plan_drafts(&mut plan, &mut budget, decode_only);
        if plan.is_empty() {
            self.break_deadlock(&report);
            self.drop_gone();
            return report;
        }
        self.run(&plan, &mut report);
        // What the step's rows cost, planning, pass, draws and verification together (session
        // commits left out): steps of decode rows and drafts only, the rows drafts are weighed
        // against (a prompt's rows take the prefill kernels and attend over fewer positions:
        // stories260K prefilled 54 rows at 25-35 µs a row and drafted at about 60). Steps that
        // wait for the weights to load are not typical either.
        if !loading && decode_only {
            let seconds = started.elapsed().saturating_sub(self.commit_time);
            self.step_times
                .observe(report.rows(), seconds.as_secs_f64());
        }
        self.drop_gone();
        report
    }

    /// Give planned decode rows draft tokens ([`crate::lookup`]): as many as their measured
    /// cost pays for ([`crate::draft_cost`]), most likely kept first, within the step's rows
    /// ([`DraftConfig::step_rows`]), its token budget and each sequence's own limits. Drafts
    /// only take free (or reclaimable cached) blocks: they never evict or preempt anything.
    fn plan_drafts(&mut self, plan: &mut [Planned], budget: &mut usize, decode_only: bool) {
        let config = self.config.draft;
        if !config.enabled() {
            return;
        }
        let rows: usize = plan.iter().map(|p| p.rows).sum();
        let room = config.step_rows().saturating_sub(rows).min(*budget);
        if room == 0 {
            return;
        }
        let context_len = self.model.context_len();
        // (plan index, where its drafts are in its tokens) of each decode row with a proposal.
        let mut offers: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
        let mut candidates: Vec<Candidate> = Vec::new();
        for (i, p) in plan.iter().enumerate() {
            let s = self.seq(p.seq);
            let decoding = p.rows == 1
                && p.output == Output::LastLogits
                && s.pending() == 1
                && !self.forks_now(p.seq);
            let Some(generation) = s.generation.as_ref().filter(|_| decoding) else {
                continue;
            };
            // Each kept draft is a token of the reply, and the last row's draw one more.
            let max = config
                .max_tokens
                .min(generation.remaining_tokens().saturating_sub(1))
                .min(context_len.saturating_sub(s.kv_len() + 1));
            let proposal = lookup::proposal(&s.tokens, &config, max);
            if !proposal.is_empty() {
                let (first, later) = s.acceptance.rates_with_prior(&self.acceptance);
                candidates.push(Candidate {
                    first,
                    later,
                    max_drafts: proposal.len(),
                });
                offers.push((i, proposal));
            }
        }
        if offers.is_empty() {
            return;
        }
        // Tokens the step draws without drafts: one for each row that ends its sequence's
        // pending tokens.
        let tokens = plan
            .iter()
            .filter(|p| p.output == Output::LastLogits)
            .count() as f64;
        let mut counts = match config.cost {
            DraftCost::Free => draft_cost::fill(&candidates, room),
            DraftCost::Measured => match self.step_times.curve() {
                Some(seconds) => draft_cost::choose(seconds, rows, tokens, &candidates, room),
                None => draft_cost::fill(&candidates, room),
            },
            DraftCost::Fixed {
                fixed_nanos,
                row_nanos,
            } => {
                let cost = StepCost {
                    fixed_seconds: fixed_nanos as f64 * 1e-9,
                    row_seconds: row_nanos as f64 * 1e-9,
                };
                draft_cost::choose(|r| cost.seconds(r), rows, tokens, &candidates, room)
            }
        };
        if counts.iter().all(|&c| c == 0) {
            self.draftless_steps += 1;
            // Only a step the fit observes measures anything.
            let explore = config.cost == DraftCost::Measured
                && decode_only
                && (self.draftless_steps >= draft_cost::EXPLORE_EVERY_STEPS
                    || !self.step_times.knows(rows + 1));
            if !explore {
                return;
            }
            // Measure what a row more costs: the likeliest sequence drafts one token.
            let best = (0..candidates.len())
                .max_by(|&a, &b| candidates[a].first.total_cmp(&candidates[b].first))
                .expect("offers");
            counts[best] = 1;
        }
        self.draftless_steps = 0;
        for ((i, proposal), count) in offers.into_iter().zip(counts) {
            if count == 0 {
                continue;
            }
            let p = &mut plan[i];
            let seq = self.seqs[p.seq.0 as usize].as_mut().expect("planned");
            let base = seq.kv_len();
            let mut rows = Vec::with_capacity(1 + count);
            rows.push(seq.tokens[base]);
            rows.extend_from_slice(&seq.tokens[proposal.start..proposal.start + count]);
            let kv = seq.kv.as_mut().expect("a running sequence has a cache");
            if kv.try_reserve(base + rows.len()).is_err() {
                continue;
            }
            *budget -= rows.len() - 1;
            self.stats.draft_tokens += (rows.len() - 1) as u64;
            p.rows = rows.len();
            p.output = Output::AllLogits;
            seq.speculation = Some(Speculation { base, rows });
        }
    }

    fn planned(&self, id: SeqId, rows: usize) -> Planned {
        let s = self.seq(id);
        let reaches_end = s.kv_len() + rows == s.tokens.len();
        let output = if s.embed.is_some() {
            Output::AllHidden
        } else if reaches_end {
            Output::LastLogits
        } else {
            Output::Nothing
        };
        Planned {
            seq: id,
            rows,
            output,
        }
    }

    /// Make sequence `id`'s cache writable for `rows` more positions, taking blocks back as
    /// the module documentation says. Returns whether it can run this step.
    fn reserve(
        &mut self,
        id: SeqId,
        rows: usize,
        plan: &mut Vec<Planned>,
        budget: &mut usize,
        report: &mut StepReport,
    ) -> bool {
        for _ in 0..8 {
            let seq = self.seq_mut(id);
            let new_len = seq.kv_len() + rows;
            let kv = seq.kv.as_mut().expect("a running sequence has a cache");
            let e = match kv.try_reserve(new_len) {
                Ok(()) => return true,
                Err(e) => e,
            };
            if self.make_room(id, &e, plan, budget) {
                continue;
            }
            let priority = self.seq(id).priority;
            if priority == Priority::Interactive {
                report.stalled.push(id);
                return false;
            }
            // Nothing below gives way: the latest-arrived running sequence of this priority
            // does (possibly this one).
            let victim = self
                .running
                .iter()
                .copied()
                .filter(|&s| self.seq(s).priority == priority)
                .max_by_key(|&s| self.seq(s).arrival)
                .unwrap_or(id);
            self.preempt(victim, id, plan, budget);
            if victim == id {
                return false;
            }
        }
        report.stalled.push(id);
        false
    }

    /// Take blocks back for `requester` until the pool has `e.needed_blocks` available, in the
    /// order of the module documentation, or take nothing and return `false` when even all of
    /// that cannot free enough.
    fn make_room(
        &mut self,
        requester: SeqId,
        e: &airs_memory::PoolExhausted,
        plan: &mut Vec<Planned>,
        budget: &mut usize,
    ) -> bool {
        let victims = self.victims(requester);
        let short = e.needed_blocks.saturating_sub(e.available_blocks);
        // The shortest prefix of the plan that frees enough (monotone: binary search).
        let frees = |k: usize| self.releasable(&victims[..k]) >= short;
        if victims.is_empty() || !frees(victims.len()) {
            return false;
        }
        let (mut lo, mut hi) = (0, victims.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if frees(mid) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let chosen = victims[..lo].to_vec();
        // In the plan's order; a session cache truncated once, at its first step, to the
        // smallest prefix planned for it.
        let mut keep: BTreeMap<SessionId, u32> = BTreeMap::new();
        for v in &chosen {
            if let Victim::Cache { session, keep: k } = *v {
                let e = keep.entry(session).or_insert(k);
                *e = (*e).min(k);
            }
        }
        for v in &chosen {
            match *v {
                Victim::Cache { session, .. } => {
                    if let Some(k) = keep.remove(&session) {
                        self.truncate_cache(session, k, requester);
                    }
                }
                Victim::Seq(s) => self.preempt(s, requester, plan, budget),
            }
        }
        true
    }

    /// Everything `requester` may take blocks from, in order.
    fn victims(&self, requester: SeqId) -> Vec<Victim> {
        let rp = self.seq(requester).priority;
        let now = self.clock.now();
        let tpb = self.config.tokens_per_block as usize;
        let cache_steps = match &self.sessions {
            Some(sessions) => {
                let descriptors: Vec<SessionDescriptor> = sessions
                    .open
                    .values()
                    .filter(|s| s.busy.is_none() && s.kv.is_some())
                    .map(|s| {
                        let len = s.cached_len();
                        SessionDescriptor {
                            id: s.id,
                            priority: s.priority,
                            last_access: s.last_access,
                            in_request: false,
                            blocks_held: s.blocks(),
                            full_blocks: (len / tpb) as u32,
                            partial_block_tokens: (len % tpb) as u32,
                        }
                    })
                    .collect();
                self.policy.plan(&descriptors, now).steps
            }
            None => Vec::new(),
        };
        let mut out = Vec::new();
        for class in [
            EvictionClass::Background,
            EvictionClass::System,
            EvictionClass::IdleInteractive,
        ] {
            out.extend(
                cache_steps
                    .iter()
                    .filter(|s| s.class == class)
                    .map(|s| Victim::Cache {
                        session: s.session,
                        keep: s.keep_blocks,
                    }),
            );
            let p = class_priority(class);
            if p != Priority::Interactive && rank(p) > rank(rp) {
                let mut seqs: Vec<SeqId> = self
                    .running
                    .iter()
                    .copied()
                    .filter(|&s| s != requester && self.seq(s).priority == p)
                    .collect();
                seqs.sort_by_key(|&s| std::cmp::Reverse(self.seq(s).arrival));
                out.extend(seqs.into_iter().map(Victim::Seq));
            }
        }
        out
    }

    /// Blocks that become available if `victims` are applied: counted once per block, and
    /// only when no holder that stays keeps it.
    fn releasable(&self, victims: &[Victim]) -> u32 {
        let mut keep: BTreeMap<SessionId, u32> = BTreeMap::new();
        let mut dropped: Vec<BlockId> = Vec::new();
        for v in victims {
            match *v {
                Victim::Cache { session, keep: k } => {
                    let e = keep.entry(session).or_insert(k);
                    *e = (*e).min(k);
                }
                Victim::Seq(s) => dropped.extend_from_slice(self.seq(s).blocks()),
            }
        }
        if let Some(sessions) = &self.sessions {
            for (sid, k) in keep {
                if let Some(kv) = sessions.open.get(&sid).and_then(|s| s.kv.as_ref()) {
                    dropped.extend(kv.table().blocks().iter().skip(k as usize).copied());
                }
            }
        }
        self.pool.memory().releasable_blocks(dropped)
    }

    /// Preempt running sequence `id` for `requester`: its KV is freed and it waits to be
    /// recomputed.
    fn preempt(
        &mut self,
        id: SeqId,
        requester: SeqId,
        plan: &mut Vec<Planned>,
        budget: &mut usize,
    ) {
        if let Some(i) = plan.iter().position(|p| p.seq == id) {
            *budget += plan.remove(i).rows;
        }
        let now = self.clock.now();
        let step = self.step_no;
        let requester_priority = self.seq(requester).priority;
        let seq = self.seq_mut(id);
        let blocks = seq.blocks().len() as u32;
        seq.kv = None;
        seq.running = false;
        seq.since = step;
        let (priority, request) = (seq.priority, seq.request);
        self.running.retain(|&s| s != id);
        self.waiting.push(id);
        self.stats.preemptions.add(priority, 1);
        if let Some(r) = self.requests.get_mut(&request) {
            r.preemptions += 1;
        }
        self.events.push(SchedulerEvent::Preempted {
            at: now,
            step,
            victim: id,
            priority,
            requester,
            requester_priority,
            blocks,
        });
    }

    /// Truncate session `id`'s cache to its first `keep_blocks` blocks (none: drop it).
    fn truncate_cache(&mut self, id: SessionId, keep_blocks: u32, requester: SeqId) {
        let tpb = self.config.tokens_per_block as usize;
        let context_len = self.model.context_len();
        let now = self.clock.now();
        let Some(sessions) = self.sessions.as_mut() else {
            return;
        };
        let caches: Vec<(SessionId, Priority, Duration, u32)> = sessions
            .open
            .values()
            .filter(|s| s.busy.is_none() && s.blocks() > 0)
            .map(|s| (s.id, s.priority, s.last_access, s.blocks()))
            .collect();
        let Some(s) = sessions.open.get_mut(&id) else {
            return;
        };
        let Some(old) = s.kv.take() else { return };
        let blocks_before = old.table().blocks().len() as u32;
        let available = |pool: &PagedKvPool| {
            let p = pool.memory().stats();
            p.blocks_free + p.blocks_cached
        };
        let available_before = available(&self.pool);
        let class = if s.priority == Priority::Interactive {
            EvictionClass::IdleInteractive
        } else if s.priority == Priority::System {
            EvictionClass::System
        } else {
            EvictionClass::Background
        };
        if keep_blocks > 0 {
            let keep_len = (keep_blocks as usize * tpb).min(old.table().len());
            // Looking up `keep_len + 1` tokens reuses at most `keep_len` positions: the first
            // `keep_blocks` blocks, which the old table holds, so the lookup finds them indexed.
            let limit = (keep_len + 1).min(s.tokens.len());
            let (new, got) = PagedKv::new_sequence_with_prefix(
                &self.pool,
                s.salt.as_deref(),
                &s.tokens[..limit],
            );
            drop(old);
            // A lookup that copied rows into a fresh block (a partial match) spent a block.
            s.kv = (got > 0 && got.is_multiple_of(tpb)).then(|| new.with_max_len(context_len));
        } else {
            drop(old);
        }
        let blocks_after = s.blocks();
        let priority = s.priority;
        let blocks_freed = available(&self.pool).saturating_sub(available_before);
        self.stats.evictions.add(priority, 1);
        self.events.push(SchedulerEvent::CacheEvicted {
            at: now,
            session: id,
            class,
            priority,
            requester,
            blocks_before,
            blocks_after,
            blocks_freed,
            caches,
        });
    }

    /// Admit waiting sequences (see the module documentation).
    fn admit(&mut self, plan: &mut Vec<Planned>, budget: &mut usize, report: &mut StepReport) {
        let mut order = self.waiting.clone();
        order.sort_by_key(|&id| self.order_key(id));
        let mut blocked: Option<WaitReason> = None;
        for id in order {
            if self.seqs[id.0 as usize].is_none() {
                continue;
            }
            if let Some(reason) = blocked {
                report.waiting.push((id, reason));
                continue;
            }
            if self.running.len() >= self.config.max_running {
                report.waiting.push((id, WaitReason::NoSlot));
                continue;
            }
            if *budget == 0 {
                report.waiting.push((id, WaitReason::NoBudget));
                continue;
            }
            match self.try_admit(id, plan, budget) {
                Admission::Admitted => {
                    report.admitted.push(id);
                    let rows = self.seq(id).pending().min(*budget);
                    plan.push(self.planned(id, rows));
                    *budget -= rows;
                }
                Admission::Skip(reason) => report.waiting.push((id, reason)),
                Admission::Wait => {
                    report.waiting.push((id, WaitReason::NoMemory));
                    // Strict priority order: what waits for memory keeps what comes after it
                    // from taking that memory — unless it is itself starving (a starving
                    // sequence must not hold up the next one).
                    if self.order_key(id).0 {
                        blocked = Some(WaitReason::Behind);
                    }
                }
                Admission::Failed(e) => {
                    let request = self.seq(id).request;
                    self.fail(request, e);
                    // The request's other choices may already be planned for this step.
                    plan.retain(|p| {
                        let live = self.seqs[p.seq.0 as usize].is_some();
                        if !live {
                            *budget += p.rows;
                        }
                        live
                    });
                }
            }
        }
    }

    fn try_admit(&mut self, id: SeqId, plan: &mut Vec<Planned>, budget: &mut usize) -> Admission {
        let request = self.seq(id).request;
        if let Err(e) = self.resolve_turn(id) {
            return match e {
                TurnError::Busy => Admission::Skip(WaitReason::SessionBusy),
                TurnError::Failed(e) => Admission::Failed(e),
            };
        }
        let context_len = self.model.context_len();
        if self.seq(id).kv.is_none() && self.prefix_in_flight(id) {
            return Admission::Skip(WaitReason::PrefixInFlight);
        }
        // A session turn may start from the session's own cache; anything else looks its
        // tokens up in the prefix index.
        let (hit, looked_up) = match self.seq(id).kv.as_ref() {
            Some(kv) => (kv.table().len(), false),
            None => {
                let seq = self.seq(id);
                let (kv, hit) =
                    PagedKv::new_sequence_with_prefix(&self.pool, seq.salt.as_deref(), &seq.tokens);
                self.seq_mut(id).kv = Some(kv.with_max_len(context_len));
                (hit, true)
            }
        };
        let need_len = self.seq(id).tokens.len();
        let mut last = None;
        for _ in 0..8 {
            let kv = self.seq_mut(id).kv.as_mut().expect("set above");
            match kv.try_reserve(need_len) {
                Ok(()) => {
                    last = None;
                    break;
                }
                Err(e) => {
                    let ok = self.make_room(id, &e, plan, budget);
                    last = Some(e);
                    if !ok {
                        break;
                    }
                }
            }
        }
        if let Some(e) = last {
            // Whether it can ever fit: the pool minus what protected session caches hold.
            let total = self.pool.memory().blocks_total();
            let protected = self.protected_cache_blocks();
            let need = self.blocks_for(need_len);
            let name = self.requester_name(id);
            self.seq_mut(id).kv = None;
            if need > total.saturating_sub(protected) {
                let mut report = self.exhausted_report(name, e, Some(id));
                report.exceeds_pool = self.pool_too_small(need_len);
                return Admission::Failed(RuntimeError::new(RuntimeErrorKind::PoolExhausted(
                    Box::new(report),
                )));
            }
            return Admission::Wait;
        }
        // Admitted.
        let step = self.step_no;
        let seq = self.seq_mut(id);
        seq.running = true;
        seq.since = step;
        let first = !seq.admitted_once;
        seq.admitted_once = true;
        let (tokens_len, computed_high, choice) = (seq.tokens.len(), seq.computed_high, seq.choice);
        self.waiting.retain(|&s| s != id);
        self.running.push(id);
        let history_computed = self.requests[&request]
            .turn
            .as_ref()
            .map_or(0, |t| t.history_computed);
        // Positions computed before (a session's history, or this sequence's own before it was
        // preempted) that the lookup did not find are recomputed: a rebuild.
        let computed_before = computed_high.max(history_computed);
        let rebuilt = computed_before.saturating_sub(hit);
        self.stats.rebuilt_tokens += rebuilt as u64;
        if let Some(req) = self.requests.get_mut(&request) {
            req.rebuilt_tokens += rebuilt;
        }
        if looked_up {
            self.stats.prefix_queried_tokens += tokens_len as u64;
            self.stats.prefix_hit_tokens += hit as u64;
        }
        if first && choice == 0 {
            let req = self.requests.get_mut(&request).expect("live request");
            self.stats.prompt_tokens += req.usage.prompt_tokens as u64;
            self.stats.prefill_tokens += (tokens_len - hit.max(computed_before)) as u64;
            req.admitted = Some(Instant::now());
            let cached = if req.turn.is_some() {
                // A turn's prompt is the tokens it appends; what was cached before them is
                // the session's own history, not a prompt token served from cache.
                let history = tokens_len - req.usage.prompt_tokens;
                hit.saturating_sub(history)
            } else {
                hit
            };
            req.usage.cached_tokens = cached;
            let prompt_tokens = req.usage.prompt_tokens;
            self.emit(
                request,
                Event::Admitted {
                    prompt_tokens,
                    cached_tokens: cached,
                },
            );
        }
        Admission::Admitted
    }

    /// Resolve a session turn's tokens at its first admission attempt.
    fn resolve_turn(&mut self, id: SeqId) -> std::result::Result<(), TurnError> {
        let request = self.seq(id).request;
        let now = self.clock.now();
        let context_len = self.model.context_len();
        let priority = self.seq(id).priority;
        let salt = self.seq(id).salt.clone();
        let Some(req) = self.requests.get_mut(&request) else {
            return Ok(());
        };
        let Some(turn) = req.turn.as_mut() else {
            return Ok(());
        };
        if turn.resolved.is_some() {
            return Ok(());
        }
        let sessions = self.sessions.as_mut().expect("checked at submission");
        let sid = sessions
            .open(
                &turn.name,
                priority,
                turn.system.as_deref(),
                turn.tools.as_ref(),
                salt.as_deref(),
                now,
            )
            .map_err(TurnError::Failed)?;
        let session = sessions.open.get_mut(&sid).expect("just opened");
        if session.busy.is_some() {
            return Err(TurnError::Busy);
        }
        if session.tools.is_none() && turn.inputs.iter().any(|(r, _)| *r == Role::Tool) {
            return Err(TurnError::Failed(RuntimeError::invalid(format!(
                "session {:?} has no tools, so no function results to send",
                turn.name
            ))));
        }
        let delta = self
            .model
            .turn_tokens(
                &session.history,
                &turn.inputs,
                session.tools.as_ref().map(|t| t.chat()),
            )
            .map_err(TurnError::Failed)?;
        let mut tokens = session.tokens.clone();
        tokens.extend_from_slice(&delta);
        if tokens.len() + 1 > context_len {
            return Err(TurnError::Failed(RuntimeError::new(
                RuntimeErrorKind::ContextFull {
                    needed: tokens.len() + 1,
                    context_len,
                },
            )));
        }
        session.busy = Some(request);
        session.last_access = now;
        let kv = session
            .kv
            .take()
            .filter(|kv| kv.table().len() == session.computed);
        let salt = session.salt.clone();
        let turn_no = session.turns;
        turn.history_computed = session.computed;
        req.usage.prompt_tokens = delta.len();
        turn.resolved = Some((sid, delta));
        // Each turn draws with its own seed, derived from the request's and the turn number
        // (a rerun of a turn draws what the first run drew).
        let generation = match &req.task {
            Task::Generate(p) => {
                let mut p = p.clone();
                p.sampler.seed = crate::store::turn_seed(p.sampler.seed, turn_no);
                Some(Generation::new(&p, 0, &self.model))
            }
            Task::Embed => None,
        };
        let seq = self.seq_mut(id);
        seq.prompt_len = tokens.len();
        seq.tokens = tokens;
        seq.salt = salt;
        seq.kv = kv;
        seq.generation = generation;
        Ok(())
    }

    /// Whether a running sequence is computing, right now, whole blocks of a prefix it shares
    /// with `id` that the prefix index does not hold yet.
    fn prefix_in_flight(&self, id: SeqId) -> bool {
        let tpb = self.config.tokens_per_block as usize;
        let seq = self.seq(id);
        let limit = seq.tokens.len().saturating_sub(1);
        let mut cached: Option<usize> = None;
        for &r in &self.running {
            let other = self.seq(r);
            if other.salt != seq.salt {
                continue;
            }
            let common = seq
                .tokens
                .iter()
                .zip(&other.tokens)
                .take_while(|(a, b)| a == b)
                .count()
                .min(limit)
                / tpb
                * tpb;
            if common == 0 || other.kv_len() >= common {
                continue;
            }
            let have = *cached.get_or_insert_with(|| {
                self.pool
                    .memory()
                    .cached_prefix_len(seq.salt.as_deref(), &seq.tokens)
            });
            if common > have {
                return true;
            }
        }
        false
    }

    /// Blocks held by session caches that may not be evicted (active interactive sessions).
    fn protected_cache_blocks(&self) -> u32 {
        let now = self.clock.now();
        let Some(sessions) = &self.sessions else {
            return 0;
        };
        sessions
            .open
            .values()
            .filter(|s| s.busy.is_none() && s.priority == Priority::Interactive)
            .filter(|s| now.saturating_sub(s.last_access) <= self.config.idle_threshold)
            .map(|s| s.blocks())
            .sum()
    }

    fn requester_name(&self, id: SeqId) -> String {
        let seq = self.seq(id);
        let turn = self
            .requests
            .get(&seq.request)
            .and_then(|r| r.turn.as_ref());
        match turn {
            Some(t) => format!("session {:?}", t.name),
            None => format!("request {}", seq.request),
        }
    }

    /// The failure report: every holder of blocks and why it was kept.
    fn exhausted_report(
        &self,
        requester: String,
        e: airs_memory::PoolExhausted,
        id: Option<SeqId>,
    ) -> PoolExhausted {
        let now = self.clock.now();
        let block_bytes = self.pool.block_bytes();
        let evictable_blocks = id.map_or(0, |id| {
            let v = self.victims(id);
            u64::from(self.releasable(&v))
        });
        let mut holders = Vec::new();
        if let Some(sessions) = &self.sessions {
            for s in sessions.open.values().filter(|s| s.blocks() > 0) {
                let d = SessionDescriptor {
                    id: s.id,
                    priority: s.priority,
                    last_access: s.last_access,
                    in_request: s.busy.is_some(),
                    blocks_held: s.blocks(),
                    full_blocks: 0,
                    partial_block_tokens: 0,
                };
                holders.push(Holder {
                    name: s.name.clone(),
                    priority: s.priority,
                    blocks: s.blocks(),
                    bytes: s.blocks() as usize * block_bytes,
                    protection: self.policy.classify(&d, now).err(),
                });
            }
        }
        for &r in &self.running {
            let seq = self.seq(r);
            let blocks = seq.blocks().len() as u32;
            if blocks == 0 {
                continue;
            }
            let name = self
                .requests
                .get(&seq.request)
                .and_then(|q| q.turn.as_ref())
                .map_or_else(|| seq.request.to_string(), |t| t.name.clone());
            let preemptible = seq.priority != Priority::Interactive;
            holders.push(Holder {
                name,
                priority: seq.priority,
                blocks,
                bytes: blocks as usize * block_bytes,
                protection: (!preemptible).then_some(Protection::InRequest),
            });
        }
        PoolExhausted {
            requester,
            pool: e,
            evictable_blocks,
            holders,
            exceeds_pool: None,
        }
    }

    /// No sequence could run: the stalled interactive sequences can only wait for each other.
    /// The latest-arrived of them fails with `PoolExhausted`, which frees its blocks.
    fn break_deadlock(&mut self, report: &StepReport) {
        let Some(&victim) = report.stalled.iter().max_by_key(|&&s| self.seq(s).arrival) else {
            return;
        };
        let rows = 1;
        let seq = self.seq(victim);
        let new_len = seq.kv_len() + rows;
        let need = self
            .blocks_for(new_len)
            .saturating_sub(seq.blocks().len() as u32);
        let p = self.pool.stats();
        let e = airs_memory::PoolExhausted {
            needed_blocks: need.max(1),
            available_blocks: p.blocks_free + p.blocks_cached,
            blocks_total: p.blocks_total,
            block_bytes: p.block_bytes,
            pool_bytes: p.pool_bytes,
        };
        let name = self.requester_name(victim);
        let report = self.exhausted_report(name, e, Some(victim));
        let request = self.seq(victim).request;
        self.fail(
            request,
            RuntimeError::new(RuntimeErrorKind::PoolExhausted(Box::new(report))),
        );
    }

    /// Cancel the requests whose sinks reported their receivers gone.
    fn drop_gone(&mut self) {
        let gone: Vec<RequestId> = self
            .requests
            .iter()
            .filter(|(_, r)| r.gone)
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            self.cancel(id);
        }
    }

    /// Run the planned rows as one batched forward pass and hand out the results.
    fn run(&mut self, plan: &[Planned], report: &mut StepReport) {
        // Declare the tokens the step computes (full blocks holding them get indexed for
        // reuse), then take the caches out for the pass.
        let mut kvs: Vec<PagedKv> = Vec::with_capacity(plan.len());
        for p in plan {
            let seq = self.seq_mut(p.seq);
            let kv = seq.kv.as_mut().expect("a scheduled sequence has a cache");
            let declared = kv.table().tokens().len();
            // Drafts are declared only once they are the sequence's tokens.
            let end = (kv.table().len() + p.rows).min(seq.tokens.len());
            if declared < end {
                let new: Vec<u32> = seq.tokens[declared..end].to_vec();
                kv.extend_tokens(&new);
            }
            kvs.push(seq.kv.take().expect("checked"));
        }
        let started = Instant::now();
        let mut out = std::mem::take(&mut self.step_out);
        let result = {
            let mut batch: Vec<BatchSeq<'_>> = Vec::with_capacity(plan.len());
            for (p, kv) in plan.iter().zip(kvs.iter_mut()) {
                let seq = self.seqs[p.seq.0 as usize].as_ref().expect("live");
                let at = kv.table().len();
                let tokens = match &seq.speculation {
                    Some(spec) => &spec.rows[..],
                    None => &seq.tokens[at..at + p.rows],
                };
                batch.push(BatchSeq {
                    kv,
                    tokens,
                    output: p.output,
                });
            }
            self.model.model.forward_batch_into(
                &self.model.runtime,
                &mut batch,
                self.config.step_tokens,
                &mut out,
            )
        };
        report.forward_time = started.elapsed();
        for (p, kv) in plan.iter().zip(kvs) {
            self.seq_mut(p.seq).kv = Some(kv);
        }
        if let Err(e) = result {
            self.step_out = out;
            let requests: Vec<RequestId> = plan.iter().map(|p| self.seq(p.seq).request).collect();
            for r in requests {
                self.fail(r, RuntimeError::from(e_clone(&e)));
            }
            return;
        }
        // Every draw from the logits first, on the engine's threads (O(vocabulary) each: with
        // 16 sequences their argmaxes were 1.4 % of a Qwen2.5 step, log-probabilities 11 %).
        let mut draws = self.draw_all(plan, &out);
        let now = self.clock.now();
        let step = self.step_no;
        self.stats.steps += 1;
        self.stats.peak_batch = self.stats.peak_batch.max(plan.len() as u64);
        for (i, p) in plan.iter().enumerate() {
            let seq = self.seq_mut(p.seq);
            seq.since = step;
            // Until its verification, a speculating sequence has computed its pending token.
            let len = seq
                .speculation
                .as_ref()
                .map_or_else(|| seq.kv_len(), |spec| spec.base + 1);
            seq.computed_high = seq.computed_high.max(len);
            if p.output == Output::AllLogits {
                report.decode_rows += 1;
                report.draft_rows += p.rows - 1;
            } else if p.rows == 1 && len == seq.tokens.len() && seq.tokens.len() > seq.prompt_len {
                report.decode_rows += 1;
            } else {
                report.prefill_rows += p.rows;
            }
            report.scheduled.push((p.seq, seq.request, p.rows));
            let request = seq.request;
            if let Some(turn) = self.requests.get(&request).and_then(|r| r.turn.as_ref())
                && let Some((sid, _)) = turn.resolved
                && let Some(s) = self.sessions.as_mut().and_then(|x| x.open.get_mut(&sid))
            {
                s.last_access = now;
            }
            match p.output {
                Output::Nothing => {}
                Output::AllHidden => self.accumulate_embedding(p.seq, out.get(i)),
                Output::LastLogits => match draws[i].take() {
                    Some(draw) => {
                        self.accept_drawn(p.seq, draw);
                    }
                    None => self.sample(p.seq, out.get(i)),
                },
                Output::AllLogits => {
                    report.drafts_accepted += self.verify_drafts(p.seq, out.get(i));
                }
            }
        }
        self.step_out = out;
        self.stats.rows += report.rows() as u64;
    }

    /// Draw a speculating sequence's tokens from the logits of its rows, the pending token's
    /// first, as decoding draws them one step at a time; while the token drawn is the next
    /// draft, that draft's row holds the logits the next step would have computed (the kernels
    /// are batch-invariant), so the next token is drawn from it. The first token that is not
    /// the next draft ends the step; the rejected drafts' positions are forgotten. Returns the
    /// drafts kept.
    fn verify_drafts(&mut self, id: SeqId, logits: &[f32]) -> usize {
        let vocab = self.model.model.config.vocab_len;
        let drafts = {
            let spec = self
                .seq(id)
                .speculation
                .as_ref()
                .expect("a speculating sequence");
            spec.rows[1..].to_vec()
        };
        let mut kept = 0;
        for (i, row) in logits.chunks_exact(vocab).enumerate() {
            let seq = self.seqs[id.0 as usize].as_mut().expect("live");
            let Seq {
                generation,
                tokens,
                acceptance,
                ..
            } = seq;
            let draw = generation
                .as_mut()
                .expect("a generating sequence")
                .draw(row, tokens);
            let agrees = drafts.get(i) == Some(&draw.token);
            if i < drafts.len() {
                acceptance.record(i, agrees);
                self.acceptance.record_overall(i, agrees);
            }
            // The choice may end here (its cache settled then, in `finish_choice`); a draft
            // the model ends the reply with is not a token of it.
            kept += usize::from(self.accept_drawn(id, draw) && agrees);
            if !agrees || !self.seqs[id.0 as usize].as_ref().is_some_and(|s| s.running) {
                break;
            }
        }
        if let Some(seq) = self.seqs[id.0 as usize].as_mut() {
            seq.settle_drafts();
            seq.computed_high = seq.computed_high.max(seq.kv_len());
        }
        self.stats.drafts_accepted += kept as u64;
        kept
    }

    fn accumulate_embedding(&mut self, id: SeqId, hidden: &[f32]) {
        let n_embd = self.model.model.config.embedding_len;
        let seq = self.seq_mut(id);
        let done = seq.kv_len() == seq.tokens.len();
        let sum = seq.embed.as_mut().expect("an embedding sequence");
        for row in hidden.chunks_exact(n_embd) {
            for (s, &v) in sum.iter_mut().zip(row) {
                *s += f64::from(v);
            }
        }
        if !done {
            return;
        }
        let rows = seq.tokens.len() as f64;
        let mean: Vec<f64> = sum.iter().map(|s| s / rows).collect();
        let norm = mean.iter().map(|v| v * v).sum::<f64>().sqrt();
        let values: Vec<f32> = mean
            .iter()
            .map(|v| if norm > 0.0 { (v / norm) as f32 } else { 0.0 })
            .collect();
        let request = seq.request;
        let prompt_tokens = seq.tokens.len();
        self.emit(
            request,
            Event::Embedding(Embedding {
                values,
                prompt_tokens,
            }),
        );
        self.complete(request, None);
    }

    /// Whether `id`'s prompt just completed and its request forks its other choices from it
    /// now (they then draw from the same logits).
    fn forks_now(&self, id: SeqId) -> bool {
        let seq = self.seq(id);
        let req = &self.requests[&seq.request];
        seq.choice == 0 && req.n > 1 && !req.forked && seq.kv_len() == seq.prompt_len
    }

    /// The draws ([`Generation::draw`]) of the planned sequences whose last logits `out` holds,
    /// by plan index, computed on the engine's threads: a draw touches only its own sequence's
    /// sampler, and each sequence draws once a step, so the tokens are those of drawing one
    /// after another. `None` for the other rows, for a request that forks its choices now
    /// ([`Scheduler::sample`] draws those in order), and for all when there is one draw (no
    /// hand-off for it).
    fn draw_all(&mut self, plan: &[Planned], out: &BatchOutput) -> Vec<Option<Draw>> {
        let mut draws: Vec<Option<Draw>> = plan.iter().map(|_| None).collect();
        let at: HashMap<usize, usize> = plan
            .iter()
            .enumerate()
            .filter(|(_, p)| p.output == Output::LastLogits && !self.forks_now(p.seq))
            .map(|(i, p)| (p.seq.0 as usize, i))
            .collect();
        if at.len() < 2 {
            return draws;
        }
        let model = Arc::clone(&self.model);
        type Job<'a> = (usize, &'a mut Generation, &'a [u32], Option<Draw>);
        let jobs: Vec<Mutex<Job<'_>>> = self
            .seqs
            .iter_mut()
            .enumerate()
            .filter_map(|(slot, seq)| {
                let i = *at.get(&slot)?;
                let Seq {
                    generation, tokens, ..
                } = seq.as_mut()?;
                let generation = generation.as_mut().expect("a generating sequence");
                Some(Mutex::new((i, generation, &tokens[..], None)))
            })
            .collect();
        model.runtime.pool.for_chunks(jobs.len(), 1, &|range| {
            for job in &jobs[range] {
                let mut job = job.lock().expect("no draw panics while holding its lock");
                let (i, generation, tokens, draw) = &mut *job;
                *draw = Some(generation.draw(out.get(*i), tokens));
            }
        });
        for job in jobs {
            let (i, _, _, draw) = job.into_inner().expect("no draw panicked");
            draws[i] = draw;
        }
        draws
    }

    /// Sample the next token of `id` (and, when its prompt just completed, fork the request's
    /// other choices from it and sample theirs from the same logits).
    fn sample(&mut self, id: SeqId, logits: &[f32]) {
        let fork = self.forks_now(id);
        let mut choices = vec![id];
        if fork {
            choices.extend(self.fork_choices(id));
        }
        for s in choices {
            self.accept_token(s, logits);
        }
    }

    fn fork_choices(&mut self, id: SeqId) -> Vec<SeqId> {
        let request = self.seq(id).request;
        let req = self.requests.get_mut(&request).expect("live request");
        req.forked = true;
        let n = req.n;
        let Task::Generate(params) = req.task.clone() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for choice in 1..n {
            let step = self.step_no;
            let arrival = self.next_arrival;
            self.next_arrival += 1;
            let generation = Generation::new(&params, choice, &self.model);
            let leader = self.seq_mut(id);
            let kv = leader.kv.as_mut().expect("running").fork();
            let seq = Seq {
                request,
                choice,
                priority: leader.priority,
                salt: leader.salt.clone(),
                tokens: leader.tokens.clone(),
                prompt_len: leader.prompt_len,
                kv: Some(kv),
                generation: Some(generation),
                embed: None,
                arrival,
                since: step,
                computed_high: leader.computed_high,
                running: true,
                admitted_once: true,
                speculation: None,
                acceptance: Acceptance::default(),
            };
            let sid = self.new_seq(seq);
            self.running.push(sid);
            out.push(sid);
        }
        let req = self.requests.get_mut(&request).expect("live request");
        req.seqs.extend_from_slice(&out);
        req.open_choices += out.len();
        out
    }

    fn accept_token(&mut self, id: SeqId, logits: &[f32]) {
        let seq = self.seq_mut(id);
        let generation = seq.generation.as_mut().expect("a generating sequence");
        let draw = generation.draw(logits, &seq.tokens);
        self.accept_drawn(id, draw);
    }

    /// Accept the token `id` drew: extend the sequence, stream it, end the choice if it ends.
    /// Returns whether the token joined the sequence (an end-of-generation token does not).
    fn accept_drawn(&mut self, id: SeqId, draw: Draw) -> bool {
        self.stats.constrained_redraws += u64::from(draw.redrawn);
        let request = self.seq(id).request;
        // A sequence holds at most the model's context and, unless it is a session's turn
        // (whose reply must not enter the history cut short), the whole KV pool: reaching
        // either ends its choice with `ContextFull` (OpenAI's `length`), its text kept.
        let mut context_len = self.model.context_len();
        if self
            .requests
            .get(&request)
            .is_some_and(|r| r.turn.is_none())
        {
            let pool_positions =
                self.pool.memory().blocks_total() as usize * self.pool.tokens_per_block();
            context_len = context_len.min(pool_positions);
        }
        let model = Arc::clone(&self.model);
        let seq = self.seq_mut(id);
        let choice = seq.choice;
        let generation = seq.generation.as_mut().expect("a generating sequence");
        let accepted =
            generation.accept_draw(&model.tokenizer, draw, seq.tokens.len(), context_len);
        if let Some(t) = accepted.token {
            seq.tokens.push(t);
        }
        let now = Instant::now();
        if let Some(req) = self.requests.get_mut(&request) {
            if accepted.token.is_some() {
                req.usage.completion_tokens += 1;
                self.stats.generated_tokens += 1;
            }
            match req.last_token {
                None => {
                    req.first_token = Some(now);
                    self.stats
                        .time_to_first_token
                        .observe(now.duration_since(req.submitted).as_secs_f64());
                }
                Some(last) if choice == 0 => {
                    req.decode_tokens += 1;
                    self.stats
                        .inter_token_latency
                        .observe(now.duration_since(last).as_secs_f64());
                }
                Some(_) => {}
            }
            if choice == 0 || req.last_token.is_none() {
                req.last_token = Some(now);
            }
        }
        if let Some(token) = accepted.token {
            self.emit(
                request,
                Event::Token(TokenEvent {
                    choice,
                    id: token,
                    text: accepted.text,
                    logprobs: accepted.logprobs,
                }),
            );
        }
        if let Some((reason, tail)) = accepted.finish {
            self.finish_choice(id, reason, tail);
        }
        accepted.token.is_some()
    }

    fn finish_choice(&mut self, id: SeqId, reason: crate::request::FinishReason, tail: String) {
        let mut seq = self.remove_seq(id);
        seq.settle_drafts();
        let generation = seq.generation.as_ref().expect("a generating sequence");
        let end = ChoiceEnd {
            choice: seq.choice,
            reason,
            tail,
            text: generation.text().to_owned(),
            tokens: generation.generated.clone(),
        };
        let request = seq.request;
        self.emit(request, Event::ChoiceEnd(end));
        let Some(req) = self.requests.get_mut(&request) else {
            return;
        };
        req.open_choices -= 1;
        if req.open_choices == 0 {
            self.complete(request, Some(seq));
        }
    }

    /// The request's last choice ended: commit a session turn, then report it done.
    fn complete(&mut self, request: RequestId, last: Option<Seq>) {
        let now = self.clock.now();
        let Some(req) = self.requests.get_mut(&request) else {
            return;
        };
        let mut turn_no = None;
        if let (Some(turn), Some(seq)) = (req.turn.as_ref(), last) {
            let (sid, delta) = turn.resolved.clone().expect("admitted");
            let generation = seq.generation.as_ref().expect("a generating sequence");
            let computed = seq.kv_len();
            let sessions = self.sessions.as_mut().expect("a session turn");
            let committing = Instant::now();
            let committed = sessions.commit_turn(
                sid,
                &turn.inputs,
                &delta,
                generation.text(),
                &generation.generated,
                computed,
                seq.kv,
                now,
            );
            self.commit_time += committing.elapsed();
            match committed {
                Ok(t) => turn_no = Some(t),
                Err(e) => {
                    self.fail(request, e);
                    return;
                }
            }
        }
        let req = self.requests.remove(&request).expect("live request");
        let mut req = req;
        let ttft = req.first_token.map(|t| t.duration_since(req.submitted));
        let decode_time = match (req.first_token, req.last_token) {
            (Some(a), Some(b)) => b.duration_since(a),
            _ => Duration::ZERO,
        };
        let prefill_time = match (req.admitted, req.first_token.or(req.last_token)) {
            (Some(a), Some(b)) => b.duration_since(a),
            _ => Duration::ZERO,
        };
        let done = Completion {
            usage: req.usage.clone(),
            turn: turn_no,
            time_to_first_token: ttft,
            decode_time,
            decode_tokens: req.decode_tokens,
            prefill_tokens: req.usage.prompt_tokens - req.usage.cached_tokens,
            prefill_time,
            preemptions: req.preemptions,
            rebuilt_tokens: req.rebuilt_tokens,
        };
        self.stats.completed += 1;
        let _ = (req.sink)(Event::Done(done));
        self.remove_seqs_of(request, &req.seqs);
    }

    // -----------------------------------------------------------------------------------------
    // Views.

    /// Every holder of KV blocks, for the pool page.
    pub fn pool_map(&self) -> PoolMap {
        let p = self.pool.stats();
        let mut holders = Vec::new();
        for seq in self.seqs.iter().flatten() {
            let blocks = seq.blocks();
            if blocks.is_empty() {
                continue;
            }
            let name = self
                .requests
                .get(&seq.request)
                .and_then(|r| r.turn.as_ref())
                .map_or_else(
                    || format!("{}/{}", seq.request, seq.choice),
                    |t| t.name.clone(),
                );
            holders.push(BlockHolder {
                name,
                kind: if seq.embed.is_some() {
                    "embedding"
                } else {
                    "request"
                },
                priority: seq.priority.name(),
                running: seq.running,
                tokens: seq.kv_len(),
                blocks: blocks.iter().map(|b| b.0).collect(),
            });
        }
        if let Some(sessions) = &self.sessions {
            for s in sessions.open.values().filter(|s| s.blocks() > 0) {
                holders.push(BlockHolder {
                    name: s.name.clone(),
                    kind: "session",
                    priority: s.priority.name(),
                    running: false,
                    tokens: s.cached_len(),
                    blocks: s
                        .kv
                        .as_ref()
                        .map(|kv| kv.table().blocks().iter().map(|b| b.0).collect())
                        .unwrap_or_default(),
                });
            }
        }
        let mut refs: BTreeMap<u32, u32> = BTreeMap::new();
        for h in &holders {
            for &b in &h.blocks {
                *refs.entry(b).or_default() += 1;
            }
        }
        PoolMap {
            tokens_per_block: p.tokens_per_block,
            block_bytes: p.block_bytes,
            blocks_total: p.blocks_total,
            blocks_used: p.blocks_used,
            blocks_cached: p.blocks_cached,
            blocks_free: p.blocks_free,
            holders,
            shared_blocks: refs
                .into_iter()
                .filter(|&(_, n)| n > 1)
                .map(|(b, _)| b)
                .collect(),
        }
    }

    /// Submit `request`, run steps until it is done, and return what it produced (tools and
    /// tests that serve one request at a time; other requests in flight advance too). A request
    /// that failed is its error.
    pub fn serve(&mut self, request: Request) -> Result<Collected> {
        let (sink, collected) = Collected::sink();
        let id = self.submit(request, sink)?;
        self.run_until_done(id);
        let mut c = std::mem::take(&mut *collected.lock().unwrap_or_else(|e| e.into_inner()));
        match c.error.take() {
            Some(e) => Err(e),
            None => Ok(c),
        }
    }

    /// Run steps until request `id` is no longer in flight (tools and tests that serve one
    /// request at a time). Other requests in flight advance too.
    pub fn run_until_done(&mut self, id: RequestId) {
        while self.requests.contains_key(&id) {
            self.step();
        }
    }

    /// Run steps until no request is in flight.
    pub fn run_to_completion(&mut self) {
        while self.has_work() {
            self.step();
        }
    }

    /// Drop every session's cached KV (their histories stay; the next turn rebuilds them).
    pub fn drop_session_caches(&mut self) {
        if let Some(s) = self.sessions.as_mut() {
            for session in s.open.values_mut() {
                if session.busy.is_none() {
                    session.kv = None;
                }
            }
        }
    }

    /// The sessions in memory: `(name, priority, turns, sequence tokens, cached tokens,
    /// blocks)`.
    pub fn sessions(&self) -> Vec<SessionSummary> {
        let now = self.clock.now();
        let Some(s) = &self.sessions else {
            return Vec::new();
        };
        s.open
            .values()
            .map(|x| SessionSummary {
                id: x.id.0,
                name: x.name.clone(),
                priority: x.priority,
                turns: x.turns,
                sequence_tokens: x.tokens.len(),
                computed_tokens: x.computed,
                cached_tokens: x.cached_len(),
                blocks: x.blocks(),
                busy: x.busy.is_some(),
                idle: now.saturating_sub(x.last_access) > self.config.idle_threshold,
            })
            .collect()
    }

    /// Every sequence in flight, for tests and introspection.
    pub fn sequences(&self) -> Vec<SeqSummary> {
        self.seqs
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (SeqId(i as u32), s)))
            .map(|(id, s)| SeqSummary {
                id,
                request: s.request,
                choice: s.choice,
                priority: s.priority,
                running: s.running,
                tokens: s.tokens.len(),
                computed: s.kv_len(),
                blocks: s.blocks().len() as u32,
                since_step: s.since,
            })
            .collect()
    }

    /// The current step number (the last one run).
    /// What a step costs in time against its rows, as measured so far ([`crate::draft_cost`];
    /// `None` before enough steps of different sizes).
    pub fn step_cost(&self) -> Option<StepCost> {
        self.step_times.estimate()
    }

    pub fn step_number(&self) -> u64 {
        self.step_no
    }

    /// The conversation of session `name` as stored in memory.
    pub fn history(&self, name: &str) -> Option<Vec<(crate::store::Role, String)>> {
        let s = self.sessions.as_ref()?;
        let id = s.find(name)?;
        Some(s.open[&id].history.clone())
    }
}

/// Everything a request's events said, collected.
#[derive(Debug, Default)]
pub struct Collected {
    /// `(prompt tokens, cached tokens)` when admitted.
    pub admitted: Option<(usize, usize)>,
    pub tokens: Vec<TokenEvent>,
    /// By choice index.
    pub choices: Vec<ChoiceEnd>,
    pub embedding: Option<Embedding>,
    pub done: Option<Completion>,
    pub error: Option<RuntimeError>,
}

impl Collected {
    /// A sink that collects into the returned cell.
    pub fn sink() -> (Sink, Arc<std::sync::Mutex<Collected>>) {
        let cell = Arc::new(std::sync::Mutex::new(Collected::default()));
        let c = Arc::clone(&cell);
        let sink: Sink = Box::new(move |event| {
            c.lock().unwrap_or_else(|e| e.into_inner()).push(event);
            true
        });
        (sink, cell)
    }

    pub fn push(&mut self, event: Event) {
        match event {
            Event::Admitted {
                prompt_tokens,
                cached_tokens,
            } => self.admitted = Some((prompt_tokens, cached_tokens)),
            Event::Token(t) => self.tokens.push(t),
            Event::ChoiceEnd(e) => {
                self.choices.push(e);
                self.choices.sort_by_key(|c| c.choice);
            }
            Event::Embedding(e) => self.embedding = Some(e),
            Event::Done(d) => self.done = Some(d),
            Event::Failed(e) => self.error = Some(e),
        }
    }

    /// The first choice's ending (every completed generation has one).
    pub fn first(&self) -> &ChoiceEnd {
        &self.choices[0]
    }
}

/// One sequence in flight, at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqSummary {
    pub id: SeqId,
    pub request: RequestId,
    pub choice: usize,
    pub priority: Priority,
    pub running: bool,
    /// Tokens of the sequence (prompt and generated; 0 for a session turn not yet resolved).
    pub tokens: usize,
    /// Positions its cache holds.
    pub computed: usize,
    pub blocks: u32,
    /// The step it last made progress in (or entered its state).
    pub since_step: u64,
}

/// One session, at one instant.
#[derive(Clone, Debug, Serialize)]
pub struct SessionSummary {
    /// The session's id in the history store.
    pub id: u64,
    pub name: String,
    #[serde(serialize_with = "ser_priority")]
    pub priority: Priority,
    pub turns: u64,
    pub sequence_tokens: usize,
    pub computed_tokens: usize,
    pub cached_tokens: usize,
    pub blocks: u32,
    pub busy: bool,
    pub idle: bool,
}

fn ser_priority<S: serde::Serializer>(p: &Priority, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(p.name())
}

/// A request [`Scheduler::submit_as`] refused, with its sink handed back.
pub struct Refused {
    pub error: RuntimeError,
    pub sink: Sink,
}

impl std::fmt::Debug for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refused")
            .field("error", &self.error)
            .finish()
    }
}

enum Admission {
    Admitted,
    Skip(WaitReason),
    Wait,
    Failed(RuntimeError),
}

enum TurnError {
    Busy,
    Failed(RuntimeError),
}

fn validate_params(p: &GenerationParams) -> Result<()> {
    if p.max_tokens == 0 {
        return Err(RuntimeError::invalid("max_tokens must be at least 1"));
    }
    if p.n == 0 || p.n > 16 {
        return Err(RuntimeError::invalid("n must be between 1 and 16"));
    }
    if p.logprobs.is_some_and(|k| k > 20) {
        return Err(RuntimeError::invalid("top_logprobs must be at most 20"));
    }
    let s = &p.sampler;
    let finite = [
        s.temperature,
        s.top_p,
        s.min_p,
        s.repeat_penalty,
        s.frequency_penalty,
        s.presence_penalty,
    ]
    .iter()
    .all(|v| v.is_finite());
    if !finite || s.temperature < 0.0 || !(0.0..=1.0).contains(&s.top_p) || s.top_p == 0.0 {
        return Err(RuntimeError::invalid(
            "temperature must be ≥ 0 and top_p in (0, 1], all sampler values finite",
        ));
    }
    if !(0.0..=1.0).contains(&s.min_p) || s.repeat_penalty <= 0.0 {
        return Err(RuntimeError::invalid(
            "min_p must be in [0, 1] and repeat_penalty positive",
        ));
    }
    if p.stop.len() > 16 || p.stop.iter().any(|s| s.len() > 1024) {
        return Err(RuntimeError::invalid(
            "at most 16 stop strings of at most 1024 bytes",
        ));
    }
    Ok(())
}

/// An engine error for each of several requests (the engine's error is not `Clone`).
fn e_clone(e: &airs_engine::EngineError) -> airs_engine::EngineError {
    use airs_engine::{EngineError, EngineErrorKind as K};
    let kind = match e.kind() {
        K::Load(m) => K::Load(m.clone()),
        K::KvExhausted(p) => K::KvExhausted(p.clone()),
        K::KvPool(m) => K::KvPool(m.clone()),
        K::TokenOutOfRange { token, vocab_len } => K::TokenOutOfRange {
            token: *token,
            vocab_len: *vocab_len,
        },
        K::ContextFull { needed, capacity } => K::ContextFull {
            needed: *needed,
            capacity: *capacity,
        },
        other => K::InvalidArgument(format!("{other:?}")),
    };
    EngineError::new(kind)
}
