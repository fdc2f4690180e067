//! A rewrite the loader applies to the file's bytes as it copies them into the region: the
//! hook by which the engine stores weights in a layout its kernels read faster (see
//! `airs_engine::repack`), at no extra pass — each chunk is rewritten in the buffer it was
//! just read into, while it is in cache, before it is copied into the region.
//!
//! The memory crate knows nothing of tensors: a transform is told the file offset of each
//! whole load chunk (`chunk_bytes` of the load options, the last one shorter) and rewrites the
//! chunk in place. It must be a function of those bytes and that offset only, so that every
//! loader that applies it (eager, lazy) produces the same region. `mmap` maps the file itself
//! and applies nothing, as does lazy when it falls back to mmap; [`crate::ModelRegion::transform`]
//! says whether a region holds transformed bytes. Cost: whatever the transform costs per chunk,
//! on the loading thread.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// A rewrite of load chunks (see the module documentation).
pub trait ChunkTransform: Send + Sync + fmt::Debug {
    /// The chunk size the transform was planned for; a load with another `chunk_bytes` is
    /// refused.
    fn chunk_bytes(&self) -> u64;
    /// Rewrite `bytes` — the file's bytes at `offset .. offset + bytes.len()`, one whole load
    /// chunk — in place.
    fn apply(&self, offset: u64, bytes: &mut [u8]);
    /// For the engine to find its own transform again.
    fn as_any(&self) -> &dyn Any;
}

/// A shared transform in [`crate::LoadOptions`]; two are equal when they are the same object.
#[derive(Clone)]
pub struct Transform(pub Arc<dyn ChunkTransform>);

impl PartialEq for Transform {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Transform {}

impl fmt::Debug for Transform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
