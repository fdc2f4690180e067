//! airs-memory: model memory for the airs runtime — the [`ModelRegion`] holding a model file's
//! image in pinned, read-only, huge-page-backed memory, the three loaders that fill it
//! (`eager`, `mmap`, `lazy` via userfaultfd), and the device memory budget.
//!
//! KV-cache memory (§6.3) is the [`KvPool`]: a byte budget carved into blocks that sequences
//! reach through [`BlockTable`]s (PagedAttention), shared by prefix through the radix index in
//! [`prefix`] (RadixAttention).
//!
//! Design: `shared/design/model-memory.md` §6.2 (model memory region, pinning, inference safety)
//! and §6.4 (lazy loading with userfaultfd, fault-around, layer prefetch), as read by the design
//! README (huge-page and base-page sizes at run time, mlock after filling, degrade visibly).
//!
//! Typical use by the engine:
//! ```no_run
//! use airs_memory::{LoadOptions, ModelRegion, RegionLayout, SpanKind};
//! # fn main() -> Result<(), airs_memory::MemoryError> {
//! let layout = RegionLayout::whole_file(1 << 20).with_span(0, 4096, SpanKind::Other);
//! let region = ModelRegion::load("model.gguf", layout, &LoadOptions::default())?;
//! for n in region.notices() {
//!     eprintln!("note: {n}");
//! }
//! let session = region.acquire();
//! let loader = region.loader();
//! loader.enter_layer(0);
//! let header = &session.bytes()[..16];
//! # let _ = header;
//! if let Some(e) = loader.error() {
//!     return Err(e);
//! }
//! # Ok(()) }
//! ```
//! Cost: see each module; the region costs the model's size in RAM and nothing per access.
//! [`registry::ModelRegistry`] keeps several regions in one model pool: LRU eviction of models no
//! session holds, security floors that are never evicted (§6.4 `select_victim`). The pool itself
//! is one account, [`account::ModelPool`]: the registry charges weights, [`KvPool::new_charged`]
//! KV blocks and the runtime its scratch, each before allocating.

pub mod account;
pub mod budget;
mod error;
mod huge_buffer;
pub mod kv_pool;
mod layout;
mod lazy;
mod loader;
pub mod prefix;
mod region;
mod storage;
mod sys;
mod transform;
pub mod uffd;

pub use error::{ErrorKind, MemoryError, Result};
pub use huge_buffer::HugePageBuffer;
pub use kv_pool::{
    BlockId, BlockTable, DEFAULT_TOKENS_PER_BLOCK, KvPool, KvPoolConfig, KvPoolCounters,
    KvPoolResidency, KvPoolStats, PinPolicy, PoolExhausted,
};
pub use layout::{RegionLayout, Span, SpanKind};
pub use lazy::CHUNK_BUFFERS as LAZY_CHUNK_BUFFERS;
pub use loader::{
    DEFAULT_CHUNK_BYTES, LoadOptions, LoadProgress, LoaderHandle, LoaderKind, MIN_CHUNK_BYTES,
    load_chunk_bytes,
};
pub use region::{Backing, ModelRegion, Notice, NoticeKind, RegionRef, RegionStats};
pub use sys::{ThpMode, huge_page_size, page_size, thp_mode};
pub use transform::{ChunkTransform, Context, Transform, max_context_bytes};
pub mod registry;
pub use account::{ChargeInfo, ModelPool, PoolCharge, PoolFull, PoolUsage, PoolUse};
pub use budget::{ModelPoolTooLarge, PoolBudget};
pub use registry::{
    Loaded, ModelId, ModelInfo, ModelRegistry, RegionLoader, RegistryError, RegistryErrorKind,
};
pub mod eviction;
