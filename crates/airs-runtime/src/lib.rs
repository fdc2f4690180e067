//! airs-runtime: the one API front ends serve models through — loading ([`LoadedModel`]),
//! requests and their event streams ([`request`]), the scheduler that batches many requests
//! over one model and one paged KV pool with priorities and preemption ([`Scheduler`]),
//! persistent sessions with SQLite histories ([`sessions`], [`store`]), the engine thread
//! front ends submit to ([`service`]), and memory admission (`airs fit`'s estimate: [`fit`]).
//!
//! Data flows one way: file → region (airs-memory) → engine (airs-engine) → runtime → front
//! ends (CLI, server). Front ends parse arguments or HTTP and print or serialize events;
//! everything they both need lives here, so `airs run` and `airs serve` produce the same tokens
//! for the same request because they call the same functions.
//!
//! ```no_run
//! use std::sync::Arc;
//! use airs_runtime::{Event, GenerationParams, LoadedModel, Prompt, Request, Scheduler,
//!                    SchedulerConfig};
//! # fn main() -> Result<(), airs_runtime::RuntimeError> {
//! let model = Arc::new(LoadedModel::open("model.gguf".as_ref(), 2)?);
//! let mut scheduler = Scheduler::new(model, SchedulerConfig::new(64 << 20), None)?;
//! let request = Request::generate(Prompt::Text("Once upon a time".into()),
//!                                 GenerationParams::default());
//! let id = scheduler.submit(request, Box::new(|event| {
//!     if let Event::Token(t) = event { print!("{}", t.text); }
//!     true
//! }))?;
//! scheduler.run_until_done(id);
//! # Ok(()) }
//! ```
//!
//! Design: §6.3 of `shared/design/model-memory.md` (KV cache management: PagedAttention block
//! tables, `CachePriority`, eviction order) as the design README reads it, and the serving
//! layout of `shared/design/layout.md`. Cost: see each module.

pub mod constraint;
pub mod draft_cost;
pub mod error;
pub mod fit;
pub(crate) mod generation;
pub mod idle;
pub mod invariants;
pub mod json_schema;
pub mod json_syntax;
pub mod lookup;
pub mod metrics;
pub mod model;
pub mod perplexity;
pub mod request;
pub mod scheduler;
pub mod schema_syntax;
pub mod service;
pub(crate) mod sessions;
pub mod store;
pub mod tools;
pub mod workload;

pub use airs_memory::eviction::{EvictionClass, Priority, Protection, SessionId};
pub use draft_cost::StepCost;
pub use error::{
    ErrorClass, Holder, PoolExhausted, PoolTooSmall, Result, RuntimeError, RuntimeErrorKind,
};
pub use idle::{Clock, ManualClock, SystemClock, damon_available};
pub use lookup::{DraftConfig, DraftCost};
pub use metrics::{Histogram, PerPriority, SchedulerStats};
pub use model::{EMBEDDED_MODEL, EMBEDDED_MODEL_NAME, LoadedModel, ModelBytes, Weights};
pub use request::{
    ChoiceEnd, Completion, Embedding, Event, FinishReason, GenerationParams, OutputFormat, Prompt,
    Request, RequestId, SessionTurn, Task, TokenEvent, TokenLogprobs, Usage,
};
pub use scheduler::{
    Collected, PoolMap, Scheduler, SchedulerConfig, SchedulerEvent, SeqId, SeqSummary,
    SessionSummary, Sink, StepReport, WaitReason,
};
pub use store::{Durability, HistoryStore, Role, SamplerSettings};
