//! The runtime's error type: one [`RuntimeError`] carrying a [`RuntimeErrorKind`] to match on,
//! and the [`PoolExhausted`] report a request gets when the KV pool cannot serve it even after
//! every evictable session was evicted (it names what holds the memory).
//!
//! Cost: one allocation per error; nothing on the success path.

use std::fmt;

use airs_memory::eviction::{Priority, Protection, SessionId};

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeErrorKind {
    /// The history database failed (open, schema, read or commit).
    #[error("history store: {0}")]
    // The message includes the cause; not also a `source` (printed chains would repeat it).
    Store(rusqlite::Error),
    /// The database holds something this runtime cannot use (wrong schema version, a history
    /// that does not add up).
    #[error("history store is inconsistent: {0}")]
    Corrupt(String),
    /// The engine failed (forward pass, model or tokenizer).
    #[error("engine: {0}")]
    Engine(airs_engine::EngineError),
    /// The chat template could not render the conversation.
    #[error("chat template: {0}")]
    Template(String),
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
    /// The conversation no longer fits the model's context.
    #[error(
        "the conversation needs {needed} positions but the model's context holds {context_len}"
    )]
    ContextFull { needed: usize, context_len: usize },
    /// The KV pool cannot serve the request even after evicting every evictable session.
    #[error("{0}")]
    PoolExhausted(Box<PoolExhausted>),
    /// The model pool's account has no room for the KV pool or scratch a manager needs.
    #[error("{0}")]
    PoolFull(airs_memory::PoolFull),
    /// An argument or configuration value was invalid.
    #[error("{0}")]
    Invalid(String),
    /// A workload file could not be read or parsed.
    #[error("workload: {0}")]
    Workload(String),
}

/// Error of every fallible runtime operation.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct RuntimeError {
    kind: RuntimeErrorKind,
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

/// One session holding KV blocks when a request could not be served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub session: SessionId,
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
    /// The session whose request failed.
    pub session: SessionId,
    pub session_name: String,
    /// The pool's own report for the last attempt.
    pub pool: airs_memory::PoolExhausted,
    /// Blocks evicting every evictable session would have freed: their blocks that no other
    /// session shares (when that was not enough, nothing was evicted).
    pub evictable_blocks: u64,
    /// Every session still holding blocks, the requester included.
    pub holders: Vec<Holder>,
}

impl fmt::Display for PoolExhausted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.pool;
        write!(
            f,
            "KV pool exhausted: session {:?} needs {} more blocks of {} bytes; {} are free or \
             reclaimable and evicting every evictable session would free {} more (pool \
             of {} blocks, budget {} bytes); memory is held by ",
            self.session_name,
            p.needed_blocks,
            p.block_bytes,
            p.available_blocks,
            self.evictable_blocks,
            p.blocks_total,
            p.pool_bytes
        )?;
        if self.holders.is_empty() {
            return f.write_str("no session");
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
