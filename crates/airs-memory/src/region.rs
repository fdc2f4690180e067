//! [`ModelRegion`]: one mapping per loaded model holding a byte-for-byte image of its GGUF file,
//! huge-page backed, read-only and pinned once filled, shared by sessions through a refcount.
//!
//! Design: §6.2 and §6.2.1 of the model-memory chapter ("Model Memory Region", "Model Page
//! Pinning and Inference Safety"), in user space: an anonymous mapping aligned to the PMD
//! huge-page size read at run time, `MADV_HUGEPAGE` + `MADV_COLLAPSE` after it is populated,
//! `mprotect(PROT_READ)`, then `mlock` (falling back to `mlock2(MLOCK_ONFAULT)`, then to unpinned,
//! each reported as a [`Notice`]). Because byte *i* of the region is byte *i* of the file, tensors
//! sit at their GGUF offsets and the header can be parsed from [`ModelRegion::as_bytes`].
//! The `mmap` loader is the exception: it maps the file itself (page cache, not pinnable).
//! Cost: the region is the model's size rounded up to a page, plus two guard pages of address
//! space; [`ModelRegion::stats`] reads `/proc/self/smaps` (milliseconds).

use std::fmt;
use std::ops::Deref;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use rustix::io::Errno;

use crate::error::{ErrorKind, MemoryError, Result};
use crate::loader::{LoadOptions, LoaderHandle, LoaderKind};
use crate::sys::{self, AnonMapping, FileMapping, ThpMode};

/// A one-line, user-facing report of a degradation (the CLI prints these).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub kind: NoticeKind,
    pub message: String,
}

/// What degraded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NoticeKind {
    /// userfaultfd unavailable: the lazy loader fell back to mmap + MADV_WILLNEED.
    LazyFellBackToMmap,
    /// Plain mlock was refused; the region is pinned with mlock2(MLOCK_ONFAULT).
    PinnedOnFault,
    /// The region could not be pinned at all.
    NotPinned,
    /// No transparent huge pages: the region uses base pages.
    NoHugePages,
    /// The region could not be made read-only.
    NotReadOnly,
    /// The lazy load failed; unread bytes read as zeros (see `LoaderHandle::error`).
    LoadFailed,
}

impl Notice {
    pub(crate) fn new(kind: NoticeKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// What backs the region's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// Private anonymous memory filled from the file (eager, lazy).
    Anonymous,
    /// The file's page cache, mapped privately read-only (mmap).
    FileMapping,
}

/// A snapshot of the region's memory state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionStats {
    /// The loader actually in use (after any fallback).
    pub loader: LoaderKind,
    pub backing: Backing,
    /// Bytes of the file image (= file length).
    pub bytes: u64,
    /// Bytes mapped (file length rounded up to the base page).
    pub mapped_bytes: u64,
    /// Resident bytes (smaps `Rss`).
    pub resident_bytes: u64,
    /// Locked bytes (smaps `Locked`).
    pub locked_bytes: u64,
    /// Bytes mapped by PMD huge pages (smaps `AnonHugePages` + `FilePmdMapped`).
    pub huge_page_bytes: u64,
    pub read_only: bool,
    /// mlock/mlock2 succeeded (always false for the mmap loader).
    pub pinned: bool,
    /// Loader progress: bytes copied into the region so far (None for mmap: not tracked).
    pub filled_bytes: Option<u64>,
    /// Time from load start until every byte was resident and the region finalized.
    pub fully_resident_after: Option<Duration>,
    pub base_page_bytes: usize,
    pub huge_page_size: usize,
}

/// Lock-free bitmap of chunks.
#[derive(Debug)]
pub(crate) struct ChunkBitmap(Vec<AtomicU64>);

impl ChunkBitmap {
    pub fn new(bits: usize) -> Self {
        Self((0..bits.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }

    /// Sets bit `i`; true if this call set it (it was clear).
    pub fn try_set(&self, i: usize) -> bool {
        let mask = 1u64 << (i % 64);
        self.0[i / 64].fetch_or(mask, Ordering::AcqRel) & mask == 0
    }

    pub fn get(&self, i: usize) -> bool {
        self.0[i / 64].load(Ordering::Acquire) & (1u64 << (i % 64)) != 0
    }
}

/// Where a load stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Loading,
    Resident,
    Failed,
}

/// Sentinel of `Shared::layer_hint`: no layer entered yet.
pub(crate) const NO_LAYER: u32 = u32::MAX;

/// State shared by the region, its loader handles and the loader threads.
#[derive(Debug)]
pub(crate) struct Shared {
    pub kind: LoaderKind,
    pub file_len: u64,
    pub chunk_bytes: u64,
    pub chunk_count: usize,
    pub filled: ChunkBitmap,
    pub filled_chunks: AtomicUsize,
    pub filled_bytes: AtomicU64,
    pub layer_hint: AtomicU32,
    /// The loader's background thread, unparked by hints and completed fills.
    pub worker: OnceLock<Thread>,
    /// Wakes the lazy fault handler out of poll (eventfd).
    pub wake_fd: Option<OwnedFd>,
    pub stop: AtomicBool,
    pub status: Mutex<Status>,
    pub status_changed: Condvar,
    pub error: OnceLock<MemoryError>,
    pub started: Instant,
    pub fully_resident_after: OnceLock<Duration>,
    pub notices: Mutex<Vec<Notice>>,
    pub pinned: AtomicBool,
    pub read_only: AtomicBool,
}

impl Shared {
    pub fn new(
        kind: LoaderKind,
        file_len: u64,
        chunk_bytes: u64,
        wake_fd: Option<OwnedFd>,
        started: Instant,
    ) -> Self {
        let chunk_count = file_len.div_ceil(chunk_bytes).max(1) as usize;
        Self {
            kind,
            file_len,
            chunk_bytes,
            chunk_count,
            filled: ChunkBitmap::new(chunk_count),
            filled_chunks: AtomicUsize::new(0),
            filled_bytes: AtomicU64::new(0),
            layer_hint: AtomicU32::new(NO_LAYER),
            worker: OnceLock::new(),
            wake_fd,
            stop: AtomicBool::new(false),
            status: Mutex::new(Status::Loading),
            status_changed: Condvar::new(),
            error: OnceLock::new(),
            started,
            fully_resident_after: OnceLock::new(),
            notices: Mutex::new(Vec::new()),
            pinned: AtomicBool::new(false),
            read_only: AtomicBool::new(false),
        }
    }

    pub fn notice(&self, notice: Notice) {
        self.notices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(notice);
    }

    /// Records chunk `c` (of `bytes` file bytes) as filled; true if this call did.
    pub fn mark_filled(&self, c: usize, bytes: u64) -> bool {
        if !self.filled.try_set(c) {
            return false;
        }
        self.filled_bytes.fetch_add(bytes, Ordering::AcqRel);
        self.filled_chunks.fetch_add(1, Ordering::AcqRel);
        true
    }

    pub fn all_filled(&self) -> bool {
        self.filled_chunks.load(Ordering::Acquire) == self.chunk_count
    }

    pub fn set_status(&self, status: Status) {
        if status == Status::Resident {
            let _ = self.fully_resident_after.set(self.started.elapsed());
        }
        *self.status.lock().unwrap_or_else(|e| e.into_inner()) = status;
        self.status_changed.notify_all();
    }

    /// Wakes the background thread and the fault handler.
    pub fn wake_threads(&self) {
        if let Some(t) = self.worker.get() {
            t.unpark();
        }
        if let Some(fd) = &self.wake_fd {
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
    }
}

/// The pages behind a region.
#[derive(Debug)]
pub(crate) enum Memory {
    Anon(Arc<AnonMapping>),
    File(Arc<FileMapping>),
}

/// Forced degradations, for tests (see [`LoadOptions`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FinalizeOptions {
    pub force_no_thp: bool,
    pub force_no_mlock: bool,
    pub force_no_mlock_onfault: bool,
    pub huge_page_size: usize,
}

impl FinalizeOptions {
    pub fn from_load(o: &LoadOptions, huge_page_size: usize) -> Self {
        Self {
            force_no_thp: o.force_no_thp,
            force_no_mlock: o.force_no_mlock,
            force_no_mlock_onfault: o.force_no_mlock_onfault,
            huge_page_size,
        }
    }
}

/// Whether huge pages may be used (not forced off, THP not `never`/absent).
pub(crate) fn huge_pages_usable(o: &FinalizeOptions) -> bool {
    !o.force_no_thp && sys::thp_usable()
}

/// Turns a filled anonymous region into model memory: huge pages, read-only, pinned.
/// Every failure degrades with a notice.
pub(crate) fn finalize_anonymous(map: &AnonMapping, shared: &Shared, o: FinalizeOptions) {
    let page_kib = sys::page_size() / 1024;
    let mode = sys::thp_mode();
    let collapse_len = map.len() / o.huge_page_size * o.huge_page_size;
    if o.force_no_thp {
        let _ = map.no_huge_pages();
        shared.notice(Notice::new(
            NoticeKind::NoHugePages,
            format!("huge pages disabled by options: model memory uses {page_kib} KiB pages"),
        ));
    } else if !huge_pages_usable(&o) {
        shared.notice(Notice::new(
            NoticeKind::NoHugePages,
            format!(
                "transparent huge pages are {}: model memory uses {page_kib} KiB pages",
                if mode == ThpMode::Never {
                    "set to never"
                } else {
                    "unavailable"
                }
            ),
        ));
    } else if collapse_len > 0 {
        let _ = map.advise_huge_pages();
        let mut result = map.collapse(0, collapse_len);
        // EAGAIN: a page was transiently busy; a retry usually completes the range.
        for _ in 0..2 {
            if result != Err(Errno::AGAIN) {
                break;
            }
            result = map.collapse(0, collapse_len);
        }
        if let Err(e) = result {
            let huge = sys::smaps_totals(map.addr(), map.addr() + map.len())
                .map(|t| t.huge)
                .unwrap_or(0);
            shared.notice(Notice::new(
                NoticeKind::NoHugePages,
                format!(
                    "MADV_COLLAPSE failed ({}): {} of {} MiB on huge pages, the rest on {page_kib} \
                     KiB pages",
                    errno_name(e),
                    huge >> 20,
                    map.len() >> 20
                ),
            ));
        }
    }
    match map.make_read_only() {
        Ok(()) => shared.read_only.store(true, Ordering::Release),
        Err(e) => shared.notice(Notice::new(
            NoticeKind::NotReadOnly,
            format!(
                "mprotect(PROT_READ) failed ({}): model memory stays writable",
                errno_name(e)
            ),
        )),
    }
    shared.pinned.store(pin(map, shared, o), Ordering::Release);
}

fn pin(map: &AnonMapping, shared: &Shared, o: FinalizeOptions) -> bool {
    let forced = |f: bool| if f { " (forced by options)" } else { "" };
    let first = if o.force_no_mlock {
        Err(Errno::NOMEM)
    } else {
        map.lock()
    };
    let Err(e1) = first else { return true };
    let second = if o.force_no_mlock_onfault {
        Err(Errno::NOMEM)
    } else {
        map.lock_on_fault()
    };
    match second {
        Ok(()) => {
            shared.notice(Notice::new(
                NoticeKind::PinnedOnFault,
                format!(
                    "mlock refused ({}){}: model memory pinned with mlock2(MLOCK_ONFAULT)",
                    errno_name(e1),
                    forced(o.force_no_mlock)
                ),
            ));
            true
        }
        Err(e2) => {
            shared.notice(Notice::new(
                NoticeKind::NotPinned,
                format!(
                    "mlock refused ({}), mlock2(MLOCK_ONFAULT) too ({}){}: model memory is not \
                     pinned (raise RLIMIT_MEMLOCK, e.g. ulimit -l)",
                    errno_name(e1),
                    errno_name(e2),
                    forced(o.force_no_mlock_onfault)
                ),
            ));
            false
        }
    }
}

/// Short errno name for notices (e.g. "EINVAL").
pub(crate) fn errno_name(e: Errno) -> String {
    let name = match e {
        Errno::INVAL => "EINVAL",
        Errno::AGAIN => "EAGAIN",
        Errno::NOMEM => "ENOMEM",
        Errno::PERM => "EPERM",
        Errno::ACCESS => "EACCES",
        Errno::NOENT => "ENOENT",
        Errno::NOSYS => "ENOSYS",
        Errno::BUSY => "EBUSY",
        _ => return format!("errno {}", e.raw_os_error()),
    };
    name.to_owned()
}

/// One loaded model's memory. Created by [`ModelRegion::load`]; shared as `Arc<ModelRegion>`.
#[derive(Debug)]
pub struct ModelRegion {
    memory: Memory,
    shared: Arc<Shared>,
    refcount: AtomicUsize,
    worker: Mutex<Option<JoinHandle<()>>>,
    huge_page_size: usize,
    /// The region's share of a model pool ([`crate::ModelRegistry`] attaches it): returned when
    /// the region itself goes, after its memory, however long sessions keep it past the
    /// registry.
    pool_charge: std::sync::OnceLock<crate::PoolCharge>,
    /// The chunk transform the loader applied to every byte of the region, if any.
    transform: Option<crate::Transform>,
}

impl ModelRegion {
    /// Loads the model file at `path` with `layout` (from the GGUF tensor table) and `options`.
    /// Returns as soon as the region can be read: after the whole file for `eager`, at once for
    /// `mmap` and `lazy` (reads of not-yet-loaded bytes block until the loader fills them).
    /// Degradations are reported by [`notices`](Self::notices), not as errors.
    pub fn load(
        path: impl AsRef<std::path::Path>,
        layout: crate::RegionLayout,
        options: &LoadOptions,
    ) -> Result<Arc<Self>> {
        crate::loader::load(path.as_ref(), layout, options)
    }

    pub(crate) fn from_parts(
        memory: Memory,
        shared: Arc<Shared>,
        worker: Option<JoinHandle<()>>,
        huge_page_size: usize,
        transform: Option<crate::Transform>,
    ) -> Self {
        Self {
            transform,
            memory,
            shared,
            refcount: AtomicUsize::new(0),
            worker: Mutex::new(worker),
            huge_page_size,
            pool_charge: std::sync::OnceLock::new(),
        }
    }

    /// The chunk transform whose output the region holds (`None`: the file's own bytes, as
    /// with `mmap` and lazy's mmap fallback, which apply none).
    pub fn transform(&self) -> Option<&std::sync::Arc<dyn crate::ChunkTransform>> {
        self.transform.as_ref().map(|t| &t.0)
    }

    /// Makes `charge` live exactly as long as the region (a region is charged once).
    pub(crate) fn attach_charge(&self, charge: crate::PoolCharge) {
        let _ = self.pool_charge.set(charge);
    }

    /// The file image: byte *i* is byte *i* of the model file. Valid as long as the region lives.
    /// During a lazy load, reading a byte not yet loaded blocks until the loader has filled its
    /// chunk (or has failed: then it reads as zero and [`LoaderHandle::error`] says why).
    pub fn as_bytes(&self) -> &[u8] {
        match &self.memory {
            Memory::Anon(m) => {
                // SAFETY: every page of the mapping is populated (eager, finished lazy) or is
                // registered with the lazy loader's userfaultfd, whose handler thread runs until
                // this region is dropped and resolves every fault (with zeros after an error).
                // Pages are installed once and never written afterwards, so the slice never
                // observes a change. The borrow of `self` keeps the mapping alive.
                let all = unsafe { m.as_slice() };
                &all[..self.shared.file_len as usize]
            }
            Memory::File(m) => m.as_slice(),
        }
    }

    /// Length of the file image in bytes.
    pub fn len(&self) -> usize {
        self.shared.file_len as usize
    }

    /// Always false: a model file is never empty (the loader rejects empty files).
    pub fn is_empty(&self) -> bool {
        self.shared.file_len == 0
    }

    /// The loader in use (after any fallback: a `lazy` request may run as `mmap`).
    pub fn loader_kind(&self) -> LoaderKind {
        self.shared.kind
    }

    /// A handle for the engine: layer hints, progress, errors, waiting for residency.
    pub fn loader(&self) -> LoaderHandle {
        LoaderHandle::new(self.shared.clone())
    }

    /// The degradations that happened so far (some arrive when a lazy load completes).
    pub fn notices(&self) -> Vec<Notice> {
        self.shared
            .notices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Registers a session; the region counts as in use until the returned guard drops.
    pub fn acquire(self: &Arc<Self>) -> RegionRef {
        self.refcount.fetch_add(1, Ordering::AcqRel);
        RegionRef {
            region: self.clone(),
        }
    }

    /// Sessions currently holding the region.
    pub fn refcount(&self) -> usize {
        self.refcount.load(Ordering::Acquire)
    }

    /// Pinned, read-only, held by at least one session, and without a loader error (§6.2.1).
    pub fn is_safe_for_inference(&self) -> bool {
        self.shared.pinned.load(Ordering::Acquire)
            && self.shared.read_only.load(Ordering::Acquire)
            && self.shared.error.get().is_none()
            && self.refcount() > 0
    }

    /// Memory statistics (reads `/proc/self/smaps`).
    pub fn stats(&self) -> RegionStats {
        let (start, len, backing) = match &self.memory {
            Memory::Anon(m) => (m.addr(), m.len(), Backing::Anonymous),
            Memory::File(m) => (m.addr(), m.len(), Backing::FileMapping),
        };
        let smaps = sys::smaps_totals(start, start + len).unwrap_or_default();
        RegionStats {
            loader: self.shared.kind,
            backing,
            bytes: self.shared.file_len,
            mapped_bytes: len as u64,
            resident_bytes: smaps.rss,
            locked_bytes: smaps.locked,
            huge_page_bytes: smaps.huge,
            read_only: self.shared.read_only.load(Ordering::Acquire),
            pinned: self.shared.pinned.load(Ordering::Acquire),
            filled_bytes: (backing == Backing::Anonymous)
                .then(|| self.shared.filled_bytes.load(Ordering::Acquire)),
            fully_resident_after: self.shared.fully_resident_after.get().copied(),
            base_page_bytes: sys::page_size(),
            huge_page_size: self.huge_page_size,
        }
    }
}

impl Drop for ModelRegion {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake_threads();
        let worker = self
            .worker
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(w) = worker {
            let _ = w.join();
        }
        if *self.shared.status.lock().unwrap_or_else(|e| e.into_inner()) == Status::Loading {
            let _ = self.shared.error.set(MemoryError::new(
                ErrorKind::Stopped,
                "region dropped during load",
            ));
            self.shared.set_status(Status::Failed);
        }
    }
}

/// A session's hold on a region: keeps it alive and counted; releases on drop.
#[derive(Debug)]
pub struct RegionRef {
    region: Arc<ModelRegion>,
}

impl RegionRef {
    /// The region's file image.
    pub fn bytes(&self) -> &[u8] {
        self.region.as_bytes()
    }

    /// The region itself.
    pub fn region(&self) -> &Arc<ModelRegion> {
        &self.region
    }
}

impl Deref for RegionRef {
    type Target = ModelRegion;
    fn deref(&self) -> &ModelRegion {
        &self.region
    }
}

impl Clone for RegionRef {
    fn clone(&self) -> Self {
        self.region.acquire()
    }
}

impl Drop for RegionRef {
    fn drop(&mut self) {
        self.region.refcount.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_sets_once() {
        let b = ChunkBitmap::new(130);
        assert!(b.try_set(129));
        assert!(!b.try_set(129));
        assert!(b.get(129));
        assert!(!b.get(128));
    }
}
