//! The session manager: serves conversation turns for many sessions of one model out of one
//! paged KV pool, evicting other sessions' caches when a request needs blocks the pool does not
//! have, and rebuilding an evicted session's cache from its persisted history on its next
//! request.
//!
//! Design: §6.3 of the model-memory chapter (PagedAttention block tables per session, eviction
//! by priority — background, then system, then idle interactive — least recently used first,
//! partial blocks first), read through the design README: eviction returns blocks to the
//! pool's free list and the session is later recomputed from the persisted conversation, never
//! paged. The policy itself is pure ([`airs_memory::eviction`]); this module applies it. Like
//! vLLM's recompute preemption, an evicted session loses the *end* of its sequence first, so
//! what it keeps is still a valid prefix; like SGLang's radix cache, a rebuild first takes
//! whatever blocks of its history the pool's prefix index still holds
//! ([`airs_memory::KvPool::new_table_with_prefix`]) and recomputes only the rest, on a pass
//! schedule that makes the recomputed rows bit-identical ([`crate::schedule`]), so the
//! continuation is exactly what it would have been without eviction.
//!
//! A request:
//! 1. encodes the user message as the tokens it appends to the session's sequence
//!    ([`crate::Engine::turn_tokens`]);
//! 2. makes the session's cache hold the sequence — as it is, or rebuilt: a prefix lookup, then
//!    the missing positions recomputed — and computes the new tokens, reserving blocks pass by
//!    pass; a reservation the pool refuses triggers eviction (below);
//! 3. decodes the reply (the sampler seeded per turn from the persisted session seed);
//! 4. commits the user message and the reply in one transaction, and only then returns the
//!    reply (the acknowledgement). Any failure before the commit leaves the history as it was
//!    and drops the session's cache (it is rebuilt on the next request).
//!
//! Eviction when a reservation fails: the policy orders the other sessions' blocks; the
//! requester and active interactive sessions are protected. If even evicting everything allowed
//! cannot free enough, nothing is evicted and the request fails with
//! [`crate::RuntimeErrorKind::PoolExhausted`], naming every session that holds memory.
//! Otherwise steps are applied in order until the pool has enough available (free or cached)
//! blocks. Truncating a session to `k` blocks is a new block table over the first `k` blocks of
//! its own sequence, found through the prefix index (every full block of a session is indexed
//! once computed), then the old table is dropped: the pool's refcounts return exactly the blocks
//! nobody else holds.
//!
//! Idle detection: every forward pass over a session's cache stamps its `last_access` with the
//! manager's [`Clock`]; the policy calls an interactive session idle once that is older than
//! the idle threshold. DAMON is reported, never used ([`crate::idle`]).
//!
//! Memory: a manager charges its KV pool (`pool_bytes`, mapped whole) and its scratch (the
//! engine's estimate for one pass over a context as long as the pool holds) to the model-pool
//! account that holds the engine's weights, at creation: a manager the pool cannot hold fails
//! there, naming what holds the pool, and nothing it allocates later is outside the account.
//!
//! Cost: a request costs its forward passes plus, when it evicts, one policy plan (O(sessions ×
//! log sessions + blocks)) and one pool scan per applied step; a rebuild costs the recomputed
//! positions' forward passes (under [`Schedule::Replay`], one per decoded position and one per
//! block of prompt). Memory: per session, its sequence's token ids and pass log.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use airs_engine::footprint::Scratch;
use airs_engine::{KvType, Logits, PagedKv, PagedKvConfig, PagedKvPool, Sampler, StopReason};
use airs_memory::eviction::{
    EvictionPolicy, EvictionStep, Priority, Protection, SessionDescriptor, SessionId,
};
use airs_memory::{PinPolicy, PoolCharge, PoolUsage, PoolUse};
use airs_tokenizer::{StreamDecoder, TokenId};
use serde::Serialize;

use crate::engine::Engine;
use crate::error::{Holder, PoolExhausted, Result, RuntimeError, RuntimeErrorKind};
use crate::idle::{Clock, SystemClock, damon_available};
use crate::schedule::{self, RebuildMode, Schedule};
use crate::store::{HistoryStore, NewMessage, Role, SamplerSettings, StoredSession};

/// How a [`SessionManager`] is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagerConfig {
    /// The KV pool's byte budget (all sessions together).
    pub pool_bytes: usize,
    /// Positions per KV block.
    pub tokens_per_block: u32,
    pub kv_type: KvType,
    pub pin: PinPolicy,
    /// Interactive sessions idle for longer than this may be evicted (default 5 minutes).
    pub idle_threshold: Duration,
    /// Most tokens per prefill pass.
    pub prefill_batch: usize,
    /// How passes are split and replayed ([`crate::schedule`]).
    pub rebuild: RebuildMode,
}

impl ManagerConfig {
    /// A pool of `pool_bytes` with the defaults: 16-position blocks, f16 KV, pinned on fault,
    /// a 5-minute idle threshold, 512-token prefill passes, the schedule chosen from the kernels.
    pub fn new(pool_bytes: usize) -> ManagerConfig {
        ManagerConfig {
            pool_bytes,
            tokens_per_block: airs_memory::DEFAULT_TOKENS_PER_BLOCK,
            kv_type: KvType::F16,
            pin: PinPolicy::default(),
            idle_threshold: EvictionPolicy::DEFAULT_IDLE_THRESHOLD,
            prefill_batch: 512,
            rebuild: RebuildMode::Auto,
        }
    }
}

/// A session to open: created with these settings if the store has no session of this name;
/// an existing session keeps its stored system prompt, sampler and salt (its priority is
/// updated).
#[derive(Clone, Debug, PartialEq)]
pub struct SessionSpec {
    pub name: String,
    pub priority: Priority,
    /// A system message that opens the conversation.
    pub system: Option<String>,
    pub sampler: SamplerSettings,
    /// Prefix-cache salt: KV prefixes are shared only among sessions with the same salt.
    pub salt: Option<Vec<u8>>,
}

impl SessionSpec {
    /// A greedy session without system prompt or salt.
    pub fn new(name: impl Into<String>, priority: Priority) -> SessionSpec {
        SessionSpec {
            name: name.into(),
            priority,
            system: None,
            sampler: SamplerSettings::default(),
            salt: None,
        }
    }

    pub fn with_system(mut self, system: impl Into<String>) -> SessionSpec {
        self.system = Some(system.into());
        self
    }
}

/// Per-request options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
}

impl Default for RequestOptions {
    fn default() -> RequestOptions {
        RequestOptions { max_tokens: 64 }
    }
}

/// How a session's cache was brought back before a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RebuildInfo {
    /// Positions the session's sequence had before the request.
    pub history_tokens: usize,
    /// Of those, positions found in the pool (the session's surviving blocks or shared prefix
    /// blocks).
    pub reused_tokens: usize,
    /// Positions recomputed.
    pub recomputed_tokens: usize,
    /// Forward passes the recomputation took.
    pub passes: usize,
}

/// The acknowledged answer to a request: committed to the history store before it is returned.
#[derive(Clone, Debug)]
pub struct Reply {
    pub session: SessionId,
    /// 0-based turn number.
    pub turn: u64,
    pub text: String,
    pub tokens: Vec<u32>,
    pub stop_reason: StopReason,
    /// Tokens the user message appended.
    pub prompt_tokens: usize,
    /// Positions computed for the prompt (new tokens not found in the prefix cache).
    pub prefill_tokens: usize,
    /// Set when the session's cache had been evicted and was rebuilt.
    pub rebuild: Option<RebuildInfo>,
    /// Eviction steps this request caused.
    pub evictions: usize,
    pub elapsed: Duration,
}

/// A session's cache state.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheState {
    /// Being served.
    InRequest,
    /// Used within the idle threshold.
    Active,
    /// Not used for longer than the idle threshold.
    Idle,
}

/// What a session is and holds, at one instant.
#[derive(Clone, Debug, Serialize)]
pub struct SessionInfo {
    #[serde(serialize_with = "ser_id")]
    pub id: SessionId,
    pub name: String,
    #[serde(serialize_with = "ser_priority")]
    pub priority: Priority,
    pub turns: u64,
    /// Tokens of the session's sequence (persisted).
    pub sequence_tokens: usize,
    /// Positions of the sequence whose KV the session's cache should hold.
    pub computed_tokens: usize,
    /// Positions its cache holds now (less than `computed_tokens` after an eviction).
    pub cached_tokens: usize,
    pub blocks: u32,
    pub bytes: usize,
    /// Time of the last KV access on the manager's clock.
    pub last_access: Duration,
    pub kv_accesses: u64,
    pub state: CacheState,
}

fn ser_id<S: serde::Serializer>(id: &SessionId, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_u64(id.0)
}

fn ser_priority<S: serde::Serializer>(p: &Priority, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(p.name())
}

/// One session as the policy saw it just before an eviction step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionSnapshot {
    pub id: SessionId,
    pub priority: Priority,
    pub last_access: Duration,
    pub in_request: bool,
    pub blocks_held: u32,
}

/// One applied eviction step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictionEvent {
    /// Manager clock time.
    pub at: Duration,
    /// The session whose request needed the blocks.
    pub requester: SessionId,
    /// The policy's step (victim, class, blocks kept).
    pub step: EvictionStep,
    pub priority: Priority,
    pub blocks_before: u32,
    pub blocks_after: u32,
    pub cached_tokens_before: usize,
    pub cached_tokens_after: usize,
    /// Blocks that became available in the pool (free or reclaimable) by this step.
    pub pool_blocks_freed: u32,
    /// Every session holding blocks just before the step, requester included.
    pub snapshot: Vec<SessionSnapshot>,
}

/// Something the manager did that tests and benchmarks check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuntimeEvent {
    Evicted(EvictionEvent),
    Rebuilt {
        session: SessionId,
        info: RebuildInfo,
    },
    /// A request failed for lack of KV memory.
    Exhausted(PoolExhausted),
}

/// Eviction counters of one priority.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PriorityEvictions {
    /// Eviction steps applied.
    pub steps: u64,
    /// Times a session of this priority lost its whole cache.
    pub sessions_emptied: u64,
    /// Block references dropped.
    pub block_refs: u64,
    /// Blocks that became available in the pool.
    pub blocks_freed: u64,
    /// `blocks_freed × block_bytes`.
    pub bytes_freed: u64,
    /// Cached positions dropped (to be recomputed).
    pub tokens_dropped: u64,
}

/// The manager's accounting.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RuntimeStats {
    pub requests: u64,
    /// Requests that failed with `PoolExhausted`.
    pub exhausted_requests: u64,
    pub rebuilds: u64,
    /// Positions recomputed by rebuilds.
    pub recomputed_tokens: u64,
    /// Positions rebuilds found still cached.
    pub rebuild_reused_tokens: u64,
    /// Prompt positions computed (rebuilds excluded).
    pub prefill_tokens: u64,
    /// Prompt positions found in the prefix cache instead.
    pub prefix_hit_tokens: u64,
    pub generated_tokens: u64,
    pub evictions_interactive: PriorityEvictions,
    pub evictions_system: PriorityEvictions,
    pub evictions_background: PriorityEvictions,
    pub sessions: usize,
    pub idle_sessions: usize,
    pub sessions_with_cache: usize,
    pub pool_bytes: usize,
    pub block_bytes: usize,
    pub blocks_total: u32,
    pub blocks_used: u32,
    pub blocks_cached: u32,
    pub blocks_free: u32,
    /// Most blocks referenced at once (sampled whenever a session's table grew).
    pub peak_blocks_used: u32,
    pub idle_threshold_ms: u64,
    /// Whether every matrix kernel the model uses gives the same bits in any pass length.
    pub batch_invariant: bool,
    /// The pass schedule in force: `free` or `replay` ([`crate::schedule`]).
    pub schedule: &'static str,
    /// Whether the kernel offers DAMON (telemetry only: idleness is tracked by the runtime).
    pub damon_available: bool,
    /// The model pool's account: everything the manager's model holds is charged there.
    pub model_pool: ModelPoolStats,
}

/// The model pool's account at one instant (bytes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ModelPoolStats {
    /// The pool's size (`u64::MAX` for an engine opened without a limit).
    pub capacity_bytes: u64,
    /// Weight regions (every model in the pool).
    pub weights_bytes: u64,
    /// KV pools' mappings.
    pub kv_cache_bytes: u64,
    pub scratch_bytes: u64,
    pub free_bytes: u64,
}

impl RuntimeStats {
    pub fn evictions(&self, p: Priority) -> &PriorityEvictions {
        match p {
            Priority::Interactive => &self.evictions_interactive,
            Priority::System => &self.evictions_system,
            Priority::Background => &self.evictions_background,
        }
    }

    fn evictions_mut(&mut self, p: Priority) -> &mut PriorityEvictions {
        match p {
            Priority::Interactive => &mut self.evictions_interactive,
            Priority::System => &mut self.evictions_system,
            Priority::Background => &mut self.evictions_background,
        }
    }
}

struct Session {
    id: SessionId,
    name: String,
    priority: Priority,
    sampler: SamplerSettings,
    salt: Option<Vec<u8>>,
    /// Roles and contents, as stored.
    history: Vec<(Role, String)>,
    next_seq: u64,
    /// The sequence: every token of the conversation, in KV order.
    tokens: Vec<u32>,
    /// Lengths of the forward passes that computed positions `0..computed`.
    log: Vec<u32>,
    /// Positions whose KV the cache holds when nothing was evicted.
    computed: usize,
    turns: u64,
    kv: Option<PagedKv>,
    last_access: Duration,
    kv_accesses: u64,
    in_request: bool,
}

impl Session {
    fn from_store(
        stored: StoredSession,
        messages: Vec<crate::store::StoredMessage>,
    ) -> Result<Session> {
        let mut s = Session {
            id: stored.id,
            name: stored.name,
            priority: stored.priority,
            sampler: stored.sampler,
            salt: stored.salt,
            history: Vec::new(),
            next_seq: 0,
            tokens: Vec::new(),
            log: Vec::new(),
            computed: 0,
            turns: 0,
            kv: None,
            last_access: Duration::ZERO,
            kv_accesses: 0,
            in_request: false,
        };
        for m in messages {
            if m.seq != s.next_seq {
                return Err(RuntimeError::corrupt(format!(
                    "session {:?}: message {} follows {}",
                    s.name, m.seq, s.next_seq
                )));
            }
            s.next_seq += 1;
            s.tokens.extend_from_slice(&m.tokens);
            s.log.extend_from_slice(&m.passes);
            if m.role == Role::Assistant {
                s.turns += 1;
                s.computed = m.computed as usize;
            }
            s.history.push((m.role, m.content));
        }
        let logged: usize = s.log.iter().map(|&n| n as usize).sum();
        if logged != s.computed || s.computed > s.tokens.len() || s.log.contains(&0) {
            return Err(RuntimeError::corrupt(format!(
                "session {:?}: {} computed positions, {} in the pass log, {} tokens",
                s.name,
                s.computed,
                logged,
                s.tokens.len()
            )));
        }
        Ok(s)
    }

    fn cached_len(&self) -> usize {
        self.kv.as_ref().map_or(0, |kv| kv.table().len())
    }

    fn blocks(&self) -> u32 {
        self.kv
            .as_ref()
            .map_or(0, |kv| kv.table().blocks().len() as u32)
    }
}

/// What one request computed (before the commit).
struct Served {
    generated: Vec<u32>,
    text: String,
    stop_reason: StopReason,
    log: Vec<u32>,
    prefill_tokens: usize,
    prefix_hit: usize,
    rebuild: Option<RebuildInfo>,
}

/// The session manager (see the module documentation). Serves one request at a time.
pub struct SessionManager {
    engine: Engine,
    store: HistoryStore,
    pool: PagedKvPool,
    config: ManagerConfig,
    schedule: Schedule,
    policy: EvictionPolicy,
    clock: Box<dyn Clock>,
    sessions: BTreeMap<SessionId, Session>,
    events: Vec<RuntimeEvent>,
    stats: RuntimeStats,
    /// Eviction steps applied during the current request.
    request_evictions: usize,
    /// The scratch's share of the model pool (the KV pool holds its own charge).
    _scratch: PoolCharge,
}

impl std::fmt::Debug for SessionManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionManager")
            .field("engine", &self.engine)
            .field("config", &self.config)
            .field("sessions", &self.sessions.len())
            .finish_non_exhaustive()
    }
}

impl SessionManager {
    /// A manager for `engine`'s model with a KV pool of `config.pool_bytes`, persisting to
    /// `store`, timing with the system clock.
    pub fn new(
        engine: Engine,
        store: HistoryStore,
        config: ManagerConfig,
    ) -> Result<SessionManager> {
        SessionManager::with_clock(engine, store, config, Box::new(SystemClock::new()))
    }

    /// As [`SessionManager::new`], with a given clock (e.g. [`crate::ManualClock`]).
    pub fn with_clock(
        engine: Engine,
        store: HistoryStore,
        config: ManagerConfig,
        clock: Box<dyn Clock>,
    ) -> Result<SessionManager> {
        if config.prefill_batch == 0 {
            return Err(RuntimeError::invalid("prefill_batch must be at least 1"));
        }
        let batch_invariant = engine.batch_invariant();
        let schedule = match config.rebuild {
            RebuildMode::Free => Schedule::Free,
            RebuildMode::Replay => Schedule::Replay,
            RebuildMode::Auto if batch_invariant => Schedule::Free,
            RebuildMode::Auto => Schedule::Replay,
        };
        let m = &engine.model.config;
        let shape = airs_engine::KvShape {
            layers: m.layers,
            kv_heads: m.kv_heads,
            head_dim: m.head_dim,
        };
        // Scratch, then the KV pool, both charged to the account holding the weights: the
        // manager cannot start on memory the model pool does not have.
        // No session holds more positions than the pool: the attention buffers' context.
        let bytes_per_token = shape
            .bytes_per_token(config.kv_type)
            .unwrap_or(usize::MAX)
            .max(1);
        let context = (config.pool_bytes / bytes_per_token).clamp(1, m.context_len.max(1));
        let scratch_bytes = Scratch::new(
            &engine.shape,
            context as u64,
            engine.runtime.pool.threads() as u64,
        )
        .total();
        let scratch = engine
            .pool()
            .charge(
                PoolUse::Scratch,
                scratch_bytes,
                format!("forward passes of {}", engine.model_key),
            )
            .map_err(|e| RuntimeError::new(RuntimeErrorKind::PoolFull(e)))?;
        let pool = PagedKvPool::new_charged(
            shape,
            config.kv_type,
            &PagedKvConfig {
                pool_bytes: config.pool_bytes,
                tokens_per_block: config.tokens_per_block,
                pin: config.pin,
            },
            engine.pool(),
        )?;
        let policy = EvictionPolicy {
            idle_threshold: config.idle_threshold,
            tokens_per_block: config.tokens_per_block,
        };
        let stats = RuntimeStats {
            pool_bytes: config.pool_bytes,
            block_bytes: pool.block_bytes(),
            blocks_total: pool.memory().blocks_total(),
            idle_threshold_ms: config.idle_threshold.as_millis() as u64,
            batch_invariant,
            schedule: schedule.name(),
            damon_available: damon_available(),
            ..RuntimeStats::default()
        };
        Ok(SessionManager {
            engine,
            store,
            pool,
            config,
            schedule,
            policy,
            clock,
            sessions: BTreeMap::new(),
            events: Vec::new(),
            stats,
            request_evictions: 0,
            _scratch: scratch,
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn store(&self) -> &HistoryStore {
        &self.store
    }

    pub fn pool(&self) -> &PagedKvPool {
        &self.pool
    }

    pub fn config(&self) -> &ManagerConfig {
        &self.config
    }

    pub fn now(&self) -> Duration {
        self.clock.now()
    }

    /// Open the session `spec.name`: loaded from the store if it exists there (bound to this
    /// manager's model), created otherwise. Its cache starts empty (built on its first request).
    pub fn open_session(&mut self, spec: &SessionSpec) -> Result<SessionId> {
        if let Some(s) = self.sessions.values_mut().find(|s| s.name == spec.name) {
            if s.priority != spec.priority {
                self.store.set_priority(s.id, spec.priority)?;
                s.priority = spec.priority;
            }
            return Ok(s.id);
        }
        let model = self.engine.model_key.clone();
        let stored = match self.store.find_session(&spec.name)? {
            Some(stored) => {
                if stored.model != model {
                    return Err(RuntimeError::new(RuntimeErrorKind::ModelMismatch {
                        session: stored.name,
                        stored: stored.model,
                        current: model,
                    }));
                }
                if stored.priority != spec.priority {
                    self.store.set_priority(stored.id, spec.priority)?;
                }
                StoredSession {
                    priority: spec.priority,
                    ..stored
                }
            }
            None => self.store.create_session(
                &spec.name,
                &model,
                spec.priority,
                &spec.sampler,
                spec.salt.as_deref(),
                spec.system.as_deref(),
            )?,
        };
        let messages = self.store.load_messages(stored.id)?;
        let mut session = Session::from_store(stored, messages)?;
        session.last_access = self.clock.now();
        let id = session.id;
        self.sessions.insert(id, session);
        Ok(id)
    }

    /// The session called `name`, if open.
    pub fn find(&self, name: &str) -> Option<SessionId> {
        self.sessions
            .values()
            .find(|s| s.name == name)
            .map(|s| s.id)
    }

    /// Change a session's priority (persisted).
    pub fn set_priority(&mut self, id: SessionId, priority: Priority) -> Result<()> {
        let s = self.session_mut(id)?;
        s.priority = priority;
        self.store.set_priority(id, priority)
    }

    /// Drop a session's cache (its history stays; the next request rebuilds it).
    pub fn drop_cache(&mut self, id: SessionId) -> Result<()> {
        self.session_mut(id)?.kv = None;
        Ok(())
    }

    /// The conversation of a session, as stored (roles and contents).
    pub fn history(&self, id: SessionId) -> Result<Vec<(Role, String)>> {
        Ok(self.session(id)?.history.clone())
    }

    /// The token ids of a session's sequence.
    pub fn sequence(&self, id: SessionId) -> Result<&[u32]> {
        Ok(&self.session(id)?.tokens)
    }

    fn session(&self, id: SessionId) -> Result<&Session> {
        self.sessions
            .get(&id)
            .ok_or_else(|| RuntimeError::new(RuntimeErrorKind::UnknownSession(id.to_string())))
    }

    fn session_mut(&mut self, id: SessionId) -> Result<&mut Session> {
        self.sessions
            .get_mut(&id)
            .ok_or_else(|| RuntimeError::new(RuntimeErrorKind::UnknownSession(id.to_string())))
    }

    fn state_of(&self, s: &Session, now: Duration) -> CacheState {
        if s.in_request {
            CacheState::InRequest
        } else if now.saturating_sub(s.last_access) > self.config.idle_threshold {
            CacheState::Idle
        } else {
            CacheState::Active
        }
    }

    /// Every open session.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        let now = self.clock.now();
        let block_bytes = self.pool.block_bytes();
        self.sessions
            .values()
            .map(|s| SessionInfo {
                id: s.id,
                name: s.name.clone(),
                priority: s.priority,
                turns: s.turns,
                sequence_tokens: s.tokens.len(),
                computed_tokens: s.computed,
                cached_tokens: s.cached_len(),
                blocks: s.blocks(),
                bytes: s.blocks() as usize * block_bytes,
                last_access: s.last_access,
                kv_accesses: s.kv_accesses,
                state: self.state_of(s, now),
            })
            .collect()
    }

    /// The accounting, with the pool's current state.
    pub fn stats(&self) -> RuntimeStats {
        let now = self.clock.now();
        let p = self.pool.stats();
        let mut s = self.stats.clone();
        let u: PoolUsage = self.engine.pool().usage();
        s.model_pool = ModelPoolStats {
            capacity_bytes: u.capacity_bytes,
            weights_bytes: u.weights_bytes,
            kv_cache_bytes: u.kv_cache_bytes,
            scratch_bytes: u.scratch_bytes,
            free_bytes: u.free_bytes(),
        };
        s.sessions = self.sessions.len();
        s.idle_sessions = self
            .sessions
            .values()
            .filter(|x| self.state_of(x, now) == CacheState::Idle)
            .count();
        s.sessions_with_cache = self.sessions.values().filter(|x| x.kv.is_some()).count();
        s.blocks_used = p.blocks_used;
        s.blocks_cached = p.blocks_cached;
        s.blocks_free = p.blocks_free;
        s.peak_blocks_used = s.peak_blocks_used.max(p.blocks_used);
        s
    }

    /// The events since the last call.
    pub fn take_events(&mut self) -> Vec<RuntimeEvent> {
        std::mem::take(&mut self.events)
    }

    /// Serve one turn: append `user` to session `id`, generate a reply, commit both, return the
    /// reply. See the module documentation.
    pub fn request(
        &mut self,
        id: SessionId,
        user: &str,
        options: &RequestOptions,
    ) -> Result<Reply> {
        let wall = Instant::now();
        if options.max_tokens == 0 {
            return Err(RuntimeError::invalid("max_tokens must be at least 1"));
        }
        let session = self.session(id)?;
        let delta = self.engine.turn_tokens(&session.history, user)?;
        let mut sequence = session.tokens.clone();
        sequence.extend_from_slice(&delta);
        let context_len = self.engine.model.config.context_len;
        if sequence.len() >= context_len {
            return Err(RuntimeError::new(RuntimeErrorKind::ContextFull {
                needed: sequence.len() + 1,
                context_len,
            }));
        }
        let max_new = options.max_tokens.min(context_len + 1 - sequence.len());
        self.stats.requests += 1;
        self.request_evictions = 0;
        let s = self.session_mut(id)?;
        s.in_request = true;
        let kv = s.kv.take();
        let served = self.serve(id, kv, &sequence, max_new);
        let s = self.sessions.get_mut(&id).expect("session exists");
        s.in_request = false;
        let (kv, served) = match served {
            Ok(x) => x,
            Err(e) => {
                if let Some(p) = e.pool_exhausted() {
                    self.stats.exhausted_requests += 1;
                    self.events.push(RuntimeEvent::Exhausted(p.clone()));
                }
                return Err(e);
            }
        };
        let computed = kv.table().len();
        debug_assert_eq!(
            served.log.iter().map(|&n| n as usize).sum::<usize>(),
            computed
        );
        let reply_tokens = served.generated.clone();
        let messages = [
            NewMessage {
                role: Role::User,
                content: user.to_owned(),
                tokens: delta.clone(),
                passes: Vec::new(),
                computed: s.computed as u64,
            },
            NewMessage {
                role: Role::Assistant,
                content: served.text.clone(),
                tokens: reply_tokens.clone(),
                passes: served.log[s.log.len()..].to_vec(),
                computed: computed as u64,
            },
        ];
        let seq = s.next_seq;
        // The acknowledgement point: nothing below runs unless the turn is durable.
        self.store.append(id, seq, &messages)?;
        let s = self.sessions.get_mut(&id).expect("session exists");
        s.next_seq += 2;
        s.history.push((Role::User, user.to_owned()));
        s.history.push((Role::Assistant, served.text.clone()));
        s.tokens = sequence;
        s.tokens.extend_from_slice(&reply_tokens);
        s.log = served.log;
        s.computed = computed;
        let turn = s.turns;
        s.turns += 1;
        s.kv = Some(kv);
        self.stats.generated_tokens += reply_tokens.len() as u64;
        self.stats.prefill_tokens += served.prefill_tokens as u64;
        self.stats.prefix_hit_tokens += served.prefix_hit as u64;
        if let Some(info) = &served.rebuild {
            self.stats.rebuilds += 1;
            self.stats.recomputed_tokens += info.recomputed_tokens as u64;
            self.stats.rebuild_reused_tokens += info.reused_tokens as u64;
            self.events.push(RuntimeEvent::Rebuilt {
                session: id,
                info: info.clone(),
            });
        }
        Ok(Reply {
            session: id,
            turn,
            text: served.text,
            tokens: reply_tokens,
            stop_reason: served.stop_reason,
            prompt_tokens: delta.len(),
            prefill_tokens: served.prefill_tokens,
            rebuild: served.rebuild,
            evictions: self.request_evictions,
            elapsed: wall.elapsed(),
        })
    }

    /// Bring the cache up to `sequence` and decode. On error the cache is dropped.
    fn serve(
        &mut self,
        id: SessionId,
        kv: Option<PagedKv>,
        sequence: &[u32],
        max_new: usize,
    ) -> Result<(PagedKv, Served)> {
        let s = self.session(id)?;
        let (computed, turn) = (s.computed, s.turns);
        let old_log = s.log.clone();
        let salt = s.salt.clone();
        let sampler_config = s.sampler.for_turn(turn);
        let end = sequence.len();
        debug_assert!(end > computed);
        let context_len = self.engine.model.config.context_len;

        // The cache and the position computing starts from.
        let tpb = self.config.tokens_per_block as usize;
        let plan = |start| {
            schedule::plan(
                self.schedule,
                &old_log,
                computed,
                start,
                end,
                tpb,
                self.config.prefill_batch,
            )
        };
        let (mut kv, start, plan) = match kv {
            Some(kv) if kv.table().len() == computed => {
                let plan = plan(computed).ok_or_else(|| {
                    RuntimeError::corrupt("the session's pass log does not add up")
                })?;
                (kv, computed, plan)
            }
            old => {
                // Take what the prefix index still has of the sequence, then let go of what the
                // session kept (the lookup holds the blocks it reuses). Under the replay
                // schedule, reuse must end on a block boundary that is a pass boundary.
                let mut limit = end;
                let found = loop {
                    let (kv, c) = PagedKv::new_sequence_with_prefix(
                        &self.pool,
                        salt.as_deref(),
                        &sequence[..limit],
                    );
                    let aligned = self.schedule == Schedule::Free || c.is_multiple_of(tpb);
                    match plan(c).filter(|_| aligned) {
                        Some(plan) => break (kv.with_max_len(context_len), c, plan),
                        // Starting at 0 is valid for every log that adds up.
                        None if c == 0 => {
                            return Err(RuntimeError::corrupt(
                                "the session's pass log does not add up",
                            ));
                        }
                        None if !c.is_multiple_of(tpb) => limit = c - c % tpb + 1,
                        None => limit = c,
                    }
                };
                drop(old);
                found
            }
        };
        let rebuild = (start < computed).then(|| RebuildInfo {
            history_tokens: computed,
            reused_tokens: start,
            recomputed_tokens: computed - start,
            passes: 0,
        });
        let prefix_hit = start.saturating_sub(computed);
        let prefill_tokens = end - start.max(computed);

        // Compute start..end, reserving the whole prompt first so a request that cannot fit
        // fails before computing anything.
        self.reserve(id, &mut kv, end)?;
        let mut logits = Vec::new();
        let mut at = start;
        let mut rebuild_passes = 0;
        for &n in &plan.passes {
            logits = self.forward(id, &mut kv, sequence, at, n)?;
            if at < computed {
                rebuild_passes += 1;
            }
            at += n;
        }
        debug_assert_eq!(at, end);
        let rebuild = rebuild.map(|r| RebuildInfo {
            passes: rebuild_passes,
            ..r
        });

        // Decode.
        let mut log = plan.log;
        let mut sampler = Sampler::new(sampler_config);
        let mut history = sequence.to_vec();
        let mut generated = Vec::new();
        let mut decoder = StreamDecoder::new();
        let mut text = String::new();
        let stop_reason = loop {
            let next = sampler.sample(&logits, &history);
            if self.engine.is_end_of_generation(next) {
                break StopReason::EndOfGeneration;
            }
            generated.push(next);
            history.push(next);
            text.push_str(decoder.push(&self.engine.tokenizer, TokenId(next)));
            if generated.len() >= max_new {
                break StopReason::MaxTokens;
            }
            let len = kv.table().len();
            self.reserve(id, &mut kv, len + 1)?;
            logits = self.forward(id, &mut kv, &history, len, 1)?;
            log.push(1);
        };
        text.push_str(decoder.finish());
        Ok((
            kv,
            Served {
                generated,
                text,
                stop_reason,
                log,
                prefill_tokens,
                prefix_hit,
                rebuild,
            },
        ))
    }

    /// One forward pass over positions `at..at + n` of `tokens` in session `id`'s cache: the
    /// session's KV access.
    fn forward(
        &mut self,
        id: SessionId,
        kv: &mut PagedKv,
        tokens: &[u32],
        at: usize,
        n: usize,
    ) -> Result<Vec<f32>> {
        debug_assert_eq!(kv.table().len(), at);
        let declared = kv.table().tokens().len();
        debug_assert_eq!(
            &kv.table().tokens()[..declared.min(at + n)],
            &tokens[..declared.min(at + n)]
        );
        if declared < at + n {
            kv.extend_tokens(&tokens[declared..at + n]);
        }
        let logits = self.engine.model.forward(
            &self.engine.runtime,
            kv,
            &tokens[at..at + n],
            Logits::Last,
        )?;
        let now = self.clock.now();
        let s = self.sessions.get_mut(&id).expect("session exists");
        s.last_access = now;
        s.kv_accesses += 1;
        Ok(logits)
    }

    /// Make `kv` (session `id`'s cache, taken out of the session) writable up to `new_len`,
    /// evicting other sessions if the pool refuses.
    fn reserve(&mut self, id: SessionId, kv: &mut PagedKv, new_len: usize) -> Result<()> {
        let before = kv.table().blocks().len();
        let mut attempts = 0;
        loop {
            match kv.try_reserve(new_len) {
                Ok(()) => break,
                Err(e) => {
                    attempts += 1;
                    if attempts > 3 {
                        return Err(self.exhausted(id, kv, e));
                    }
                    self.make_room(id, kv, e)?;
                }
            }
        }
        if kv.table().blocks().len() != before {
            let used = self.pool.memory().stats().blocks_used;
            self.stats.peak_blocks_used = self.stats.peak_blocks_used.max(used);
        }
        Ok(())
    }

    fn pool_available(&self) -> u32 {
        let p = self.pool.memory().stats();
        p.blocks_free + p.blocks_cached
    }

    fn descriptors(&self, requester: SessionId, requester_kv: &PagedKv) -> Vec<SessionDescriptor> {
        let tpb = self.config.tokens_per_block as usize;
        let describe = |id, priority, last_access, in_request, kv: &PagedKv| {
            let len = kv.table().len();
            SessionDescriptor {
                id,
                priority,
                last_access,
                in_request,
                blocks_held: kv.table().blocks().len() as u32,
                full_blocks: (len / tpb) as u32,
                partial_block_tokens: (len % tpb) as u32,
            }
        };
        let mut out = Vec::new();
        for s in self.sessions.values() {
            if s.id == requester {
                out.push(describe(
                    s.id,
                    s.priority,
                    s.last_access,
                    true,
                    requester_kv,
                ));
            } else if let Some(kv) = &s.kv {
                out.push(describe(s.id, s.priority, s.last_access, s.in_request, kv));
            }
        }
        out
    }

    fn snapshot(&self, requester: SessionId, requester_kv: &PagedKv) -> Vec<SessionSnapshot> {
        self.descriptors(requester, requester_kv)
            .into_iter()
            .map(|d| SessionSnapshot {
                id: d.id,
                priority: d.priority,
                last_access: d.last_access,
                in_request: d.in_request,
                blocks_held: d.blocks_held,
            })
            .collect()
    }

    /// Evict other sessions until the pool has `e.needed_blocks` available, or fail without
    /// evicting anything if the policy cannot free that many.
    fn make_room(
        &mut self,
        requester: SessionId,
        requester_kv: &PagedKv,
        e: airs_memory::PoolExhausted,
    ) -> Result<()> {
        let now = self.clock.now();
        let plan = self
            .policy
            .plan(&self.descriptors(requester, requester_kv), now);
        let need = e.needed_blocks;
        let mut available = e.available_blocks;
        // What the whole plan would free — shared prefix blocks count only when every holder
        // is evicted — decided before anyone is evicted.
        if available.saturating_add(self.releasable(&plan)) < need {
            return Err(self.exhausted(requester, requester_kv, e));
        }
        let block_bytes = self.pool.block_bytes() as u64;
        for step in plan.steps {
            if available >= need {
                break;
            }
            let snapshot = self.snapshot(requester, requester_kv);
            let Some(victim) = self.sessions.get(&step.session) else {
                continue;
            };
            let priority = victim.priority;
            let (blocks_before, tokens_before) = (victim.blocks(), victim.cached_len());
            if step.keep_blocks >= blocks_before {
                continue; // an earlier step already took more than planned
            }
            self.truncate(step.session, step.keep_blocks);
            let victim = &self.sessions[&step.session];
            let (blocks_after, tokens_after) = (victim.blocks(), victim.cached_len());
            let now_available = self.pool_available();
            let freed = now_available.saturating_sub(available);
            available = now_available;
            let c = self.stats.evictions_mut(priority);
            c.steps += 1;
            c.sessions_emptied += u64::from(blocks_after == 0);
            c.block_refs += u64::from(blocks_before - blocks_after);
            c.blocks_freed += u64::from(freed);
            c.bytes_freed += u64::from(freed) * block_bytes;
            c.tokens_dropped += (tokens_before - tokens_after) as u64;
            self.request_evictions += 1;
            self.events.push(RuntimeEvent::Evicted(EvictionEvent {
                at: now,
                requester,
                step,
                priority,
                blocks_before,
                blocks_after,
                cached_tokens_before: tokens_before,
                cached_tokens_after: tokens_after,
                pool_blocks_freed: freed,
                snapshot,
            }));
        }
        if available < need {
            return Err(self.exhausted(requester, requester_kv, e));
        }
        Ok(())
    }

    /// Truncate session `id`'s cache to its first `keep_blocks` blocks (none: drop it).
    fn truncate(&mut self, id: SessionId, keep_blocks: u32) {
        let tpb = self.config.tokens_per_block as usize;
        let context_len = self.engine.model.config.context_len;
        let s = self.sessions.get_mut(&id).expect("victim exists");
        let Some(old) = s.kv.take() else { return };
        if keep_blocks == 0 {
            return;
        }
        let keep_len = (keep_blocks as usize * tpb).min(old.table().len());
        // Looking up `keep_len + 1` tokens reuses at most `keep_len` positions: the first
        // `keep_blocks` blocks, which the old table holds, so the lookup finds them indexed.
        let limit = (keep_len + 1).min(s.tokens.len());
        let (new, got) =
            PagedKv::new_sequence_with_prefix(&self.pool, s.salt.as_deref(), &s.tokens[..limit]);
        drop(old);
        // A lookup that copied rows into a fresh block (a partial match) spent a block: drop it.
        s.kv = (got > 0 && got.is_multiple_of(tpb)).then(|| new.with_max_len(context_len));
    }

    /// Blocks that become available if every step of `plan` is applied: the victims' block
    /// references beyond what each keeps, counted once per block and only when no kept table
    /// (a protected session, the requester, a victim's kept prefix) still refers to it.
    fn releasable(&self, plan: &airs_memory::eviction::EvictionPlan) -> u32 {
        let mut keep: BTreeMap<SessionId, u32> = BTreeMap::new();
        for step in &plan.steps {
            let k = keep.entry(step.session).or_insert(step.keep_blocks);
            *k = (*k).min(step.keep_blocks);
        }
        let dropped = keep.iter().flat_map(|(id, &k)| {
            self.sessions
                .get(id)
                .and_then(|s| s.kv.as_ref())
                .map(|kv| kv.table().blocks())
                .unwrap_or(&[])
                .iter()
                .skip(k as usize)
                .copied()
        });
        self.pool.memory().releasable_blocks(dropped)
    }

    /// The failure report: every session holding blocks and why it was kept.
    fn exhausted(
        &self,
        requester: SessionId,
        requester_kv: &PagedKv,
        e: airs_memory::PoolExhausted,
    ) -> RuntimeError {
        let now = self.clock.now();
        let block_bytes = self.pool.block_bytes();
        let descriptors = self.descriptors(requester, requester_kv);
        let evictable_blocks = u64::from(self.releasable(&self.policy.plan(&descriptors, now)));
        let holders = descriptors
            .into_iter()
            .filter(|d| d.blocks_held > 0)
            .map(|d| Holder {
                session: d.id,
                name: self.sessions[&d.id].name.clone(),
                priority: d.priority,
                blocks: d.blocks_held,
                bytes: d.blocks_held as usize * block_bytes,
                protection: self.policy.classify(&d, now).err(),
            })
            .collect();
        let name = self.sessions[&requester].name.clone();
        RuntimeError::new(RuntimeErrorKind::PoolExhausted(Box::new(PoolExhausted {
            session: requester,
            session_name: name,
            pool: e,
            evictable_blocks,
            holders,
        })))
    }

    /// Why `id` may not be evicted right now, if it may not.
    pub fn protection(&self, id: SessionId) -> Result<Option<Protection>> {
        let s = self.session(id)?;
        let d = SessionDescriptor {
            id,
            priority: s.priority,
            last_access: s.last_access,
            in_request: s.in_request,
            blocks_held: s.blocks(),
            full_blocks: 0,
            partial_block_tokens: 0,
        };
        Ok(self.policy.classify(&d, self.clock.now()).err())
    }
}
