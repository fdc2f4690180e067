//! A rewrite the loader applies to the file's bytes as it copies them into the region: the
//! hook by which the engine stores weights in a layout its kernels read faster (see
//! `airs_engine::repack`), at no extra pass — each chunk is rewritten in the buffer it was
//! just read into, while it is in cache, before it is copied into the region.
//!
//! The memory crate knows nothing of tensors: a transform is told the file offset of each
//! whole load chunk (`chunk_bytes` of the load options, the last one shorter) and rewrites the
//! chunk in place. A unit of the rewrite may straddle a chunk boundary (a group of rows that
//! starts in one chunk and ends in the next): the transform then asks for the file's bytes on
//! either side of the chunk ([`ChunkTransform::context`]), which the loader reads with the
//! chunk — untransformed, since the neighbouring chunk may already be rewritten or not yet read —
//! and passes alongside it. A transform must be a function of the file's bytes and the chunk's
//! offset only, so that every loader that applies it (eager, lazy) produces the same region. `mmap` maps the file itself
//! and applies nothing, as does lazy when it falls back to mmap; [`crate::ModelRegion::transform`]
//! says whether a region holds transformed bytes. Cost: whatever the transform costs per chunk,
//! on the loading thread.

use std::any::Any;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use crate::error::Result;
use crate::storage::Storage;

/// The file's bytes just around a chunk, as [`ChunkTransform::context`] asked for them:
/// `before` ends where the chunk starts, `after` starts where it ends. Read-only: only the
/// chunk's own bytes reach the region.
#[derive(Clone, Copy, Debug, Default)]
pub struct Context<'a> {
    pub before: &'a [u8],
    pub after: &'a [u8],
}

/// A rewrite of load chunks (see the module documentation).
pub trait ChunkTransform: Send + Sync + fmt::Debug {
    /// The chunk size the transform was planned for; a load with another `chunk_bytes` is
    /// refused.
    fn chunk_bytes(&self) -> u64;
    /// How many of the file's bytes before and after the chunk at `chunk` (file offsets)
    /// [`ChunkTransform::apply`] needs to rewrite it; each at most
    /// [`max_context_bytes`]`(chunk_bytes)` (more is a bug, and the loader passes no more).
    /// The loader reads them with the chunk.
    fn context(&self, chunk: Range<u64>) -> (u64, u64) {
        let _ = chunk;
        (0, 0)
    }
    /// Rewrite `bytes` — the file's bytes at `offset .. offset + bytes.len()`, one whole load
    /// chunk — in place, given the file's bytes around it that [`ChunkTransform::context`]
    /// asked for.
    fn apply(&self, offset: u64, bytes: &mut [u8], context: Context<'_>);
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

/// The most context a transform may ask for on either side of a chunk of `chunk_bytes`: an
/// eighth of it, so that a loader's context buffers hold at most a quarter of a chunk (what
/// memory estimates count) and the extra reading stays below a quarter of the file.
pub const fn max_context_bytes(chunk_bytes: u64) -> u64 {
    chunk_bytes / 8
}

/// A loader's buffers for the [`Context`] of one chunk at a time.
#[derive(Debug, Default)]
pub(crate) struct ContextBuffers {
    before: Vec<u8>,
    after: Vec<u8>,
}

impl ContextBuffers {
    /// Reads the context `transform` asks for around `chunk` (clamped to the file), booking
    /// it on the paced device like the chunk itself; returns when the device delivers it
    /// (`None` when unpaced or when nothing was asked for).
    pub fn read(
        &mut self,
        storage: &Storage,
        transform: &dyn ChunkTransform,
        chunk: Range<u64>,
        file_len: u64,
    ) -> Result<Option<Instant>> {
        let (before, after) = transform.context(chunk.clone());
        let most = max_context_bytes(transform.chunk_bytes());
        debug_assert!(
            before <= most && after <= most,
            "context beyond max_context_bytes"
        );
        let before = before.min(most).min(chunk.start);
        let after = after.min(most).min(file_len.saturating_sub(chunk.end));
        self.before.resize(before as usize, 0);
        self.after.resize(after as usize, 0);
        let mut ready = None;
        if before > 0 {
            ready = ready.max(storage.read_booked(chunk.start - before, &mut self.before)?);
        }
        if after > 0 {
            ready = ready.max(storage.read_booked(chunk.end, &mut self.after)?);
        }
        Ok(ready)
    }

    /// The context last read.
    pub fn get(&self) -> Context<'_> {
        Context {
            before: &self.before,
            after: &self.after,
        }
    }
}
