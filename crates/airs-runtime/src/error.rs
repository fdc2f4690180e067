//! The runtime's error type: one [`RuntimeError`] carrying a [`RuntimeErrorKind`] to match on
//! (causes kept as types, so a server maps an error to a status without reading its message:
//! [`RuntimeError::class`]), and the [`PoolExhausted`] report a request gets when the KV pool
//! cannot serve it even after every evictable cache was evicted (it names what holds the
//! memory).
//!
//! Cost: one allocation per error; nothing on the success path.

use std::fmt;

use airs_engine::EngineErrorKind;
use airs_memory::eviction::{Priority, Protection};

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeErrorKind {
    /// The history database failed (open, schema, read or commit).
    #[error("history store: {0}")]
    // The message includes the cause; not also a `source` (printed chains would repeat it).
    Store(rusqlite::Error),
    /// Another process writes to the history database (its writer lock, `<db>-lock`, is
    /// held): two writers would interleave turns of the same sessions.
    #[error(
        "the session database {0} is in use by another airs process (only one may write to it; \
         `airs session --show` reads it while that one runs)"
    )]
    StoreInUse(String),
    /// The database holds something this runtime cannot use (wrong schema version, a history
    /// that does not add up).
    #[error("history store is inconsistent: {0}")]
    Corrupt(String),
    /// The engine failed (forward pass, model, tokenizer, weights, KV pool).
    #[error("{0}")]
    Engine(airs_engine::EngineError),
    /// The chat template could not render the conversation.
    #[error("chat template: {0}")]
    Template(airs_tokenizer::chat::ChatTemplateError),
    /// No session has this id or name.
    #[error("no session {0}")]
    UnknownSession(String),
    /// The session was created for another model (token ids are model-specific).
    #[error("session {session:?} was created with model {stored:?}, not {current:?}")]
    ModelMismatch {
        session: String,
        stored: String,
        current: String,
    },
    /// The prompt (or conversation) does not fit the model's context.
    #[error(
        "the prompt needs {needed} positions but the model's context holds {context_len} \
         (at least one position must be left to generate into)"
    )]
    ContextFull { needed: usize, context_len: usize },
    /// The KV pool cannot serve the request even after evicting every evictable cache.
    #[error("{0}")]
    PoolExhausted(Box<PoolExhausted>),
    /// The model pool's account has no room for the KV pool or scratch a scheduler needs.
    #[error("{0}")]
    PoolFull(airs_memory::PoolFull),
    /// The queue of waiting requests is full.
    #[error("the request queue is full ({limit} requests waiting)")]
    QueueFull { limit: usize },
    /// The request was cancelled (its client went away).
    #[error("the request was cancelled")]
    Cancelled,
    /// The runtime is shutting down and accepts no more work.
    #[error("the runtime is shutting down")]
    ShuttingDown,
    /// The engine thread stopped on an internal error (a panic, with its message): nothing
    /// more runs on it; the front end may start the model again.
    #[error("the engine stopped on an internal error: {0}")]
    EngineFailed(String),
    /// An argument or configuration value was invalid.
    #[error("{0}")]
    Invalid(String),
    /// A workload file could not be read or parsed.
    #[error("workload: {0}")]
    Workload(String),
    /// A KL-divergence reference is malformed or was made for another text, model or protocol.
    #[error("KLD reference: {0}")]
    KldReference(crate::perplexity::KldReferenceError),
}

/// Error of every fallible runtime operation.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct RuntimeError {
    kind: RuntimeErrorKind,
}

/// How a front end should answer an error: the class of its cause.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// The request is wrong (malformed, too long for the context, unknown session): 400.
    BadRequest,
    /// Too many requests are waiting: 429, retry later.
    Overloaded,
    /// No memory for it now (KV or model pool), or the runtime is stopping: 503, retry later.
    Unavailable,
    /// The request was cancelled by its client.
    Cancelled,
    /// Anything else: 500.
    Internal,
}

impl RuntimeError {
    pub fn new(kind: RuntimeErrorKind) -> RuntimeError {
        RuntimeError { kind }
    }

    pub fn kind(&self) -> &RuntimeErrorKind {
        &self.kind
    }

    pub fn into_kind(self) -> RuntimeErrorKind {
        self.kind
    }

    /// The pool report, if this is a pool exhaustion.
    pub fn pool_exhausted(&self) -> Option<&PoolExhausted> {
        match &self.kind {
            RuntimeErrorKind::PoolExhausted(p) => Some(p),
            _ => None,
        }
    }

    /// What kind of answer this error calls for (see [`ErrorClass`]).
    pub fn class(&self) -> ErrorClass {
        use RuntimeErrorKind as K;
        match &self.kind {
            K::ContextFull { .. }
            | K::Invalid(_)
            | K::Template(_)
            | K::UnknownSession(_)
            | K::ModelMismatch { .. }
            | K::KldReference(_) => ErrorClass::BadRequest,
            K::QueueFull { .. } => ErrorClass::Overloaded,
            K::PoolExhausted(p) if p.exceeds_pool.is_some() => ErrorClass::BadRequest,
            K::PoolExhausted(_) | K::PoolFull(_) | K::ShuttingDown | K::EngineFailed(_) => {
                ErrorClass::Unavailable
            }
            K::Cancelled => ErrorClass::Cancelled,
            K::Engine(e) => match e.kind() {
                EngineErrorKind::TokenOutOfRange { .. }
                | EngineErrorKind::ContextFull { .. }
                | EngineErrorKind::InvalidArgument(_) => ErrorClass::BadRequest,
                EngineErrorKind::KvExhausted(_)
                | EngineErrorKind::KvPool(_)
                | EngineErrorKind::ModelPool(_) => ErrorClass::Unavailable,
                _ => ErrorClass::Internal,
            },
            K::Store(_) | K::StoreInUse(_) | K::Corrupt(_) | K::Workload(_) => ErrorClass::Internal,
        }
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> RuntimeError {
        RuntimeError::new(RuntimeErrorKind::Invalid(msg.into()))
    }

    pub(crate) fn corrupt(msg: impl Into<String>) -> RuntimeError {
        RuntimeError::new(RuntimeErrorKind::Corrupt(msg.into()))
    }
}

impl From<rusqlite::Error> for RuntimeError {
    fn from(e: rusqlite::Error) -> RuntimeError {
        RuntimeError::new(RuntimeErrorKind::Store(e))
    }
}

impl From<airs_engine::EngineError> for RuntimeError {
    fn from(e: airs_engine::EngineError) -> RuntimeError {
        RuntimeError::new(RuntimeErrorKind::Engine(e))
    }
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// One holder of KV blocks when a request could not be served: a session's cache between
/// turns, or a running request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The session's name, or the request's id (`req-N`).
    pub name: String,
    pub priority: Priority,
    pub blocks: u32,
    /// `blocks × block_bytes` (a block shared with another holder is counted by both).
    pub bytes: usize,
    /// Why it may not be evicted; `None` if it may.
    pub protection: Option<Protection>,
}

/// The KV pool cannot serve a request: how much was needed, what was available, and who holds
/// the rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolExhausted {
    /// The request that failed: its session's name, or its id.
    pub requester: String,
    /// The pool's own report for the last attempt.
    pub pool: airs_memory::PoolExhausted,
    /// Blocks evicting every cache and preempting every request it may would have freed (when
    /// that was not enough, nothing was evicted).
    pub evictable_blocks: u64,
    /// Every holder of blocks, the requester included.
    pub holders: Vec<Holder>,
    /// The request needs more blocks than the whole pool has: this pool can never serve it,
    /// whatever finishes or is evicted, so it is the request's fault (a bad request, like a
    /// prompt past the model's context), not a state to retry through.
    pub exceeds_pool: Option<PoolTooSmall>,
}

/// A request larger than the whole KV pool, in positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolTooSmall {
    /// Positions the request needs (its prompt and one to generate into).
    pub needed_tokens: usize,
    /// Positions the whole pool holds.
    pub pool_tokens: usize,
}

impl fmt::Display for PoolExhausted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.pool;
        if let Some(t) = &self.exceeds_pool {
            write!(
                f,
                "the request needs {} positions of KV cache but the whole pool holds {}: ",
                t.needed_tokens, t.pool_tokens
            )?;
        }
        write!(
            f,
            "KV pool exhausted: {} needs {} more blocks of {} bytes; {} are free or \
             reclaimable and evicting everything it may evict would free {} more (pool \
             of {} blocks, budget {} bytes); memory is held by ",
            self.requester,
            p.needed_blocks,
            p.block_bytes,
            p.available_blocks,
            self.evictable_blocks,
            p.blocks_total,
            p.pool_bytes
        )?;
        if self.holders.is_empty() {
            return f.write_str("nothing else");
        }
        for (i, h) in self.holders.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(
                f,
                "{:?} ({}, {} blocks = {} bytes, ",
                h.name, h.priority, h.blocks, h.bytes
            )?;
            match &h.protection {
                Some(why) => write!(f, "{why})")?,
                None => f.write_str("evictable)")?,
            }
        }
        Ok(())
    }
}
