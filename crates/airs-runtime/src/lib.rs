//! airs-runtime: conversation sessions over the paged KV cache — sessions with priorities and
//! persisted histories (SQLite), a session manager that serves requests, evicts KV caches by
//! priority when the pool runs out and rebuilds evicted caches exactly from the history, and a
//! scripted workload runner (`airs bench sessions`).
//!
//! Design: §6.3 of `shared/design/model-memory.md` (KV cache management: PagedAttention block
//! tables, `CachePriority`, eviction order, DAMON for idleness) as the design README reads it —
//! eviction returns blocks to the pool and the session is recomputed from its persisted
//! conversation; the runtime, which performs every KV access, tracks idleness itself and reports
//! DAMON as telemetry. The pure eviction policy lives in [`airs_memory::eviction`].
//!
//! ```no_run
//! use airs_runtime::{Engine, HistoryStore, ManagerConfig, RequestOptions, SessionManager,
//!                    SessionSpec, Priority, Durability};
//! # fn main() -> Result<(), airs_runtime::RuntimeError> {
//! let engine = Engine::open("model.gguf".as_ref(), 4)?;
//! let store = HistoryStore::open("history.db".as_ref(), Durability::Full)?;
//! let mut manager = SessionManager::new(engine, store, ManagerConfig::new(64 << 20))?;
//! let id = manager.open_session(&SessionSpec::new("chat", Priority::Interactive))?;
//! let reply = manager.request(id, "Hello!", &RequestOptions { max_tokens: 32 })?;
//! println!("{}", reply.text); // committed before it was returned
//! # Ok(()) }
//! ```
//!
//! Cost: see each module; a session costs its token ids and pass log in memory, its KV blocks
//! in the pool while cached, and its messages on disk.

pub mod engine;
pub mod error;
pub mod idle;
pub mod invariants;
pub mod manager;
pub mod schedule;
pub mod store;
pub mod workload;

pub use airs_memory::eviction::{EvictionClass, Priority, Protection, SessionId};
pub use engine::Engine;
pub use error::{Holder, PoolExhausted, Result, RuntimeError, RuntimeErrorKind};
pub use idle::{Clock, ManualClock, SystemClock, damon_available};
pub use manager::{
    CacheState, EvictionEvent, ManagerConfig, ModelPoolStats, PriorityEvictions, RebuildInfo,
    Reply, RequestOptions, RuntimeEvent, RuntimeStats, SessionInfo, SessionManager,
    SessionSnapshot, SessionSpec,
};
pub use schedule::{RebuildMode, Schedule};
pub use store::{Durability, HistoryStore, Role, SamplerSettings};
