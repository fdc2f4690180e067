//! The three loaders (`eager`, `mmap`, `lazy`), their options, and the [`LoaderHandle`] the
//! engine uses while a model loads.
//!
//! Design: §6.4 "Model Loading and Eviction". `eager` reads the whole file into the region and
//! finalizes it (the baseline: time to first token = file size / storage bandwidth). `mmap` maps
//! the file and lets the kernel page it in on demand (what llama.cpp does; page cache, not
//! pinnable). `lazy` registers the region with userfaultfd so inference starts at once while a
//! fault handler, a layer prefetcher and a background filler load it (see [`crate::lazy`]); where
//! userfaultfd is not permitted it degrades to `mmap` with `MADV_WILLNEED` readahead in layer order,
//! reported as a [`Notice`](crate::Notice).
//! Cost: `eager` blocks for the whole read; the others return after a few syscalls and keep one
//! (mmap fallback) or two (lazy) threads until the load completes.

use std::fmt;
use std::ops::Range;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use crate::error::{ErrorKind, MemoryError, Result};
use crate::layout::{ChunkPlan, RegionLayout};
use crate::region::{
    FinalizeOptions, Memory, ModelRegion, NO_LAYER, Notice, NoticeKind, Shared, Status,
    finalize_anonymous, huge_pages_usable,
};
use crate::storage::{Storage, sleep_until};
use crate::sys::{self, AnonMapping, FileMapping};
use crate::transform::{ContextBuffers, Transform};

/// Smallest allowed `chunk_bytes` (the kernel's own fault-around is 64 KiB).
pub const MIN_CHUNK_BYTES: usize = 64 << 10;
/// Default `chunk_bytes`: one x86-64/arm64-4K huge page.
pub const DEFAULT_CHUNK_BYTES: usize = 2 << 20;

/// Which loader fills the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LoaderKind {
    /// Read the whole file, then finalize (huge pages, read-only, pinned).
    Eager,
    /// Map the file read-only; the kernel pages it in on demand.
    Mmap,
    /// userfaultfd: inference starts at once; faults, prefetch and a filler load the region.
    #[default]
    Lazy,
}

impl LoaderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LoaderKind::Eager => "eager",
            LoaderKind::Mmap => "mmap",
            LoaderKind::Lazy => "lazy",
        }
    }
}

impl fmt::Display for LoaderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LoaderKind {
    type Err = MemoryError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "eager" => Ok(LoaderKind::Eager),
            "mmap" => Ok(LoaderKind::Mmap),
            "lazy" => Ok(LoaderKind::Lazy),
            _ => Err(MemoryError::new(
                ErrorKind::Config,
                format!("unknown loader {s:?} (expected eager, mmap or lazy)"),
            )),
        }
    }
}

/// How to load a model. All configuration is explicit (no environment variables).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOptions {
    pub loader: LoaderKind,
    /// Fault-around and read unit in bytes (≥ 64 KiB; rounded up to the base page size).
    pub chunk_bytes: usize,
    /// Pace every loader read to this many bytes/s (emulates SD-card storage). Not applied to
    /// `mmap`, whose reads the kernel does.
    pub storage_bytes_per_s: Option<u64>,
    /// Lazy: the background filler loads the rest of the file when nothing else is pending.
    pub background_fill: bool,
    /// Lazy: additional pace for the background filler only (faults and prefetch are not paced
    /// by it), bytes/s.
    pub filler_bytes_per_s: Option<u64>,
    /// Lazy and mmap fallback: on entering layer k, prefetch layers k+1 ..= k+prefetch_layers.
    pub prefetch_layers: u32,
    /// Test hook: behave as if userfaultfd were not permitted.
    pub force_no_uffd: bool,
    /// Test hook: behave as if `mlock` were refused (then `mlock2(MLOCK_ONFAULT)` is tried).
    pub force_no_mlock: bool,
    /// Test hook: behave as if `mlock2(MLOCK_ONFAULT)` were refused too.
    pub force_no_mlock_onfault: bool,
    /// Test hook: behave as if transparent huge pages were unavailable.
    pub force_no_thp: bool,
    /// Rewrite each chunk as it is copied into the region (eager and lazy; see
    /// [`crate::ChunkTransform`]).
    pub transform: Option<Transform>,
    /// Whether the engine may plan a `transform` of its own when none is given (weights
    /// repacked for its kernels: `airs_engine::repack`). The loaders themselves only apply
    /// `transform`.
    pub repack: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            loader: LoaderKind::default(),
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            storage_bytes_per_s: None,
            background_fill: true,
            filler_bytes_per_s: None,
            prefetch_layers: 2,
            force_no_uffd: false,
            force_no_mlock: false,
            force_no_mlock_onfault: false,
            force_no_thp: false,
            transform: None,
            repack: true,
        }
    }
}

impl LoadOptions {
    /// Default options with `loader`.
    pub fn with_loader(loader: LoaderKind) -> Self {
        Self {
            loader,
            ..Self::default()
        }
    }
}

/// Loader progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadProgress {
    /// Bytes copied into the region (0 for mmap: not tracked).
    pub filled_bytes: u64,
    pub total_bytes: u64,
}

/// The engine's view of a load in progress. Cheap to clone; all methods are thread-safe.
#[derive(Debug, Clone)]
pub struct LoaderHandle {
    shared: Arc<Shared>,
}

impl LoaderHandle {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// The loader in use (after any fallback).
    pub fn kind(&self) -> LoaderKind {
        self.shared.kind
    }

    /// Tells the loader inference is entering layer `layer`: it prefetches the next
    /// `prefetch_layers` layers ahead of the background filler. Lock-free: one atomic store and an
    /// unpark of the loader thread.
    pub fn enter_layer(&self, layer: u32) {
        if self.shared.layer_hint.swap(layer, Ordering::AcqRel) != layer
            && let Some(t) = self.shared.worker.get()
        {
            t.unpark();
        }
    }

    /// The last layer hint (from `enter_layer` or from a fault in a layer), if any.
    pub fn current_layer(&self) -> Option<u32> {
        let l = self.shared.layer_hint.load(Ordering::Acquire);
        (l != NO_LAYER).then_some(l)
    }

    /// The sticky loader error: once set, bytes not yet loaded read as zeros and the model must
    /// not be used. The engine checks this (e.g. after each token).
    pub fn error(&self) -> Option<MemoryError> {
        self.shared.error.get().cloned()
    }

    /// Bytes loaded so far.
    pub fn progress(&self) -> LoadProgress {
        LoadProgress {
            filled_bytes: self.shared.filled_bytes.load(Ordering::Acquire),
            total_bytes: self.shared.file_len,
        }
    }

    /// Whether every chunk overlapping `range` (byte offsets) has been loaded. Always false for
    /// mmap (residency of the page cache is not tracked).
    pub fn is_filled(&self, range: Range<u64>) -> bool {
        if self.shared.kind == LoaderKind::Mmap || range.start >= range.end {
            return self.shared.kind != LoaderKind::Mmap;
        }
        let cb = self.shared.chunk_bytes;
        let last = ((range.end - 1) / cb).min(self.shared.chunk_count as u64 - 1);
        (range.start / cb..=last).all(|c| self.shared.filled.get(c as usize))
    }

    /// True once the region is fully loaded and finalized (always true for mmap).
    pub fn is_resident(&self) -> bool {
        *self.status() == Status::Resident
    }

    fn status(&self) -> std::sync::MutexGuard<'_, Status> {
        self.shared
            .status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Blocks until the region is fully loaded and finalized; `Err` with the loader error if the
    /// load failed. Returns at once for mmap (nothing to wait for).
    pub fn wait_resident(&self) -> Result<()> {
        let mut s = self.status();
        while *s == Status::Loading {
            s = self
                .shared
                .status_changed
                .wait(s)
                .unwrap_or_else(PoisonError::into_inner);
        }
        self.outcome(*s).map(|_| ())
    }

    /// Like [`wait_resident`](Self::wait_resident) with a timeout: `Ok(false)` if still loading.
    pub fn wait_resident_timeout(&self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        let mut s = self.status();
        while *s == Status::Loading {
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            s = self
                .shared
                .status_changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        self.outcome(*s)
    }

    fn outcome(&self, s: Status) -> Result<bool> {
        match s {
            Status::Resident => Ok(true),
            Status::Loading => Ok(false),
            Status::Failed => Err(self
                .error()
                .unwrap_or_else(|| MemoryError::new(ErrorKind::Stopped, "load did not complete"))),
        }
    }

    /// Time from load start until the region was fully resident and finalized.
    pub fn fully_resident_after(&self) -> Option<Duration> {
        self.shared.fully_resident_after.get().copied()
    }
}

/// The chunk size a load with `chunk_bytes` in its options actually uses (rounded up to the
/// base page size): what a [`crate::ChunkTransform`] must be planned for.
pub fn load_chunk_bytes(chunk_bytes: usize) -> u64 {
    sys::round_up(chunk_bytes, sys::page_size()) as u64
}

pub(crate) fn load(path: &Path, layout: RegionLayout, o: &LoadOptions) -> Result<Arc<ModelRegion>> {
    let started = Instant::now();
    if o.chunk_bytes < MIN_CHUNK_BYTES {
        return Err(MemoryError::new(
            ErrorKind::Config,
            format!("chunk_bytes {} is below {MIN_CHUNK_BYTES}", o.chunk_bytes),
        ));
    }
    let chunk_bytes = load_chunk_bytes(o.chunk_bytes);
    let (storage, file_len) = Storage::open(path, o.storage_bytes_per_s)?;
    if file_len == 0 || layout.file_len != file_len {
        return Err(MemoryError::new(
            ErrorKind::Layout,
            format!(
                "{}: layout is for {} bytes, file has {file_len}",
                path.display(),
                layout.file_len
            ),
        ));
    }
    layout.validate()?;
    if let Some(t) = &o.transform
        && t.0.chunk_bytes() != chunk_bytes
    {
        return Err(MemoryError::new(
            ErrorKind::Config,
            format!(
                "the chunk transform was planned for {}-byte chunks, the load uses {chunk_bytes}",
                t.0.chunk_bytes()
            ),
        ));
    }
    usize::try_from(file_len)
        .ok()
        .filter(|&n| n < isize::MAX as usize / 2)
        .ok_or_else(|| MemoryError::new(ErrorKind::Map, "file larger than the address space"))?;
    let huge = sys::huge_page_size();
    match o.loader {
        LoaderKind::Eager => load_eager(storage, file_len, chunk_bytes, o, huge, started),
        LoaderKind::Mmap => load_mmap(storage, &layout, chunk_bytes, o, huge, started, None),
        LoaderKind::Lazy => {
            let start = if o.force_no_uffd {
                Err(crate::lazy::StartError::Unavailable {
                    storage,
                    reason: "userfaultfd disabled by options".into(),
                })
            } else {
                crate::lazy::start(storage, &layout, chunk_bytes, o, huge, started)
            };
            match start {
                Ok(region) => Ok(region),
                Err(crate::lazy::StartError::Fatal(e)) => Err(e),
                Err(crate::lazy::StartError::Unavailable { storage, reason }) => {
                    let notice = Notice::new(
                        NoticeKind::LazyFellBackToMmap,
                        format!(
                            "{reason}: lazy loader fell back to mmap with MADV_WILLNEED readahead \
                             in layer order"
                        ),
                    );
                    load_mmap(
                        storage,
                        &layout,
                        chunk_bytes,
                        o,
                        huge,
                        started,
                        Some(notice),
                    )
                }
            }
        }
    }
}

fn load_eager(
    storage: Storage,
    file_len: u64,
    chunk_bytes: u64,
    o: &LoadOptions,
    huge: usize,
    started: Instant,
) -> Result<Arc<ModelRegion>> {
    let map = AnonMapping::new(file_len as usize, huge)
        .map_err(|e| MemoryError::with_errno(ErrorKind::Map, "anonymous model region", e))?;
    let shared = Arc::new(Shared::new(
        LoaderKind::Eager,
        file_len,
        chunk_bytes,
        None,
        started,
    ));
    let finalize = FinalizeOptions::from_load(o, huge);
    if huge_pages_usable(&finalize) {
        // Faults during the reads below then get huge pages directly: no collapse copy later.
        let _ = map.advise_huge_pages();
    }
    {
        // SAFETY: the mapping was just created read-write, is not registered with a
        // userfaultfd, and nothing else references it until the region is built below.
        let dst = unsafe { map.as_mut_slice() };
        let mut context = ContextBuffers::default();
        for c in 0..shared.chunk_count {
            let start = c as u64 * chunk_bytes;
            let end = (start + chunk_bytes).min(file_len);
            if end < file_len {
                storage.will_need(end, chunk_bytes.min(file_len - end));
            }
            let chunk = &mut dst[start as usize..end as usize];
            storage.read_exact_at(start, chunk)?;
            if let Some(t) = &o.transform {
                if let Some(ready) = context.read(&storage, &*t.0, start..end, file_len)? {
                    sleep_until(ready);
                }
                t.0.apply(start, chunk, context.get());
            }
            storage.drop_cache(start, end - start);
            shared.mark_filled(c, end - start);
        }
    }
    finalize_anonymous(&map, &shared, finalize);
    shared.set_status(Status::Resident);
    Ok(Arc::new(ModelRegion::from_parts(
        Memory::Anon(Arc::new(map)),
        shared,
        None,
        huge,
        o.transform.clone(),
    )))
}

fn load_mmap(
    storage: Storage,
    layout: &RegionLayout,
    chunk_bytes: u64,
    o: &LoadOptions,
    huge: usize,
    started: Instant,
    fallback: Option<Notice>,
) -> Result<Arc<ModelRegion>> {
    let map = Arc::new(
        FileMapping::new(storage.file(), layout.file_len as usize)
            .map_err(|e| MemoryError::with_errno(ErrorKind::Map, "file mapping", e))?,
    );
    let shared = Arc::new(Shared::new(
        LoaderKind::Mmap,
        layout.file_len,
        chunk_bytes,
        None,
        started,
    ));
    shared.read_only.store(true, Ordering::Release);
    shared.set_status(Status::Resident);
    let mut worker = None;
    if let Some(notice) = fallback {
        shared.notice(notice);
        let plan = ChunkPlan::new(layout, chunk_bytes);
        let (m, s, window) = (map.clone(), shared.clone(), o.prefetch_layers);
        let spawned = std::thread::Builder::new()
            .name("airs-readahead".into())
            .spawn(move || readahead(&m, &s, &plan, window));
        // Readahead is an optimisation: without the thread the kernel still pages in on demand.
        if let Ok(handle) = spawned {
            let _ = shared.worker.set(handle.thread().clone());
            worker = Some(handle);
        }
    }
    drop(storage);
    Ok(Arc::new(ModelRegion::from_parts(
        Memory::File(map),
        shared,
        worker,
        huge,
        None,
    )))
}

/// mmap fallback: `MADV_WILLNEED` over the file in fill order, hinted layers first.
fn readahead(map: &FileMapping, shared: &Shared, plan: &ChunkPlan, window: u32) {
    let file_len = shared.file_len;
    let mut order = plan.fill_order.iter();
    let mut served_hint = NO_LAYER;
    while !shared.stop.load(Ordering::Acquire) {
        let hint = shared.layer_hint.load(Ordering::Acquire);
        if hint != served_hint && hint != NO_LAYER {
            served_hint = hint;
            for layer in hint.saturating_add(1)..=hint.saturating_add(window) {
                for &c in plan.layer_chunks.get(layer as usize).into_iter().flatten() {
                    let r = plan.chunk_range(c as usize, file_len);
                    let _ = map.will_need(r.start as usize, (r.end - r.start) as usize);
                }
            }
            continue;
        }
        if let Some(&c) = order.next() {
            let r = plan.chunk_range(c as usize, file_len);
            let _ = map.will_need(r.start as usize, (r.end - r.start) as usize);
            continue;
        }
        std::thread::park_timeout(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loader_kind_parses_and_prints() {
        for k in [LoaderKind::Eager, LoaderKind::Mmap, LoaderKind::Lazy] {
            assert_eq!(k.as_str().parse::<LoaderKind>().unwrap(), k);
        }
        assert_eq!(LoaderKind::default(), LoaderKind::Lazy);
        assert_eq!(
            "fast".parse::<LoaderKind>().unwrap_err().kind(),
            ErrorKind::Config
        );
    }

    #[test]
    fn small_chunks_are_refused() {
        let o = LoadOptions {
            chunk_bytes: 4096,
            ..LoadOptions::default()
        };
        let e = load(Path::new("/nonexistent"), RegionLayout::whole_file(1), &o).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
    }
}
