//! airs-memory: model memory for the airs runtime — the [`ModelRegion`] holding a model file's
//! image in pinned, read-only, huge-page-backed memory, the three loaders that fill it
//! (`eager`, `mmap`, `lazy` via userfaultfd), and the device memory budget.
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

pub mod budget;
mod error;
mod layout;
mod lazy;
mod loader;
mod region;
mod storage;
mod sys;
pub mod uffd;

pub use error::{ErrorKind, MemoryError, Result};
pub use layout::{RegionLayout, Span, SpanKind};
pub use loader::{
    DEFAULT_CHUNK_BYTES, LoadOptions, LoadProgress, LoaderHandle, LoaderKind, MIN_CHUNK_BYTES,
};
pub use region::{Backing, ModelRegion, Notice, NoticeKind, RegionRef, RegionStats};
pub use sys::{ThpMode, huge_page_size, page_size, thp_mode};
