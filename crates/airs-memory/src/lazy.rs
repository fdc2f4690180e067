//! The lazy loader: the region is registered with userfaultfd and filled while inference runs.
//!
//! Design: §6.4 steps 2–7 of the model-memory chapter, with the fault-around and deterministic
//! layer prefetch it proposes. Two threads share one [`Worker`]:
//! - the **fault handler** polls the userfaultfd and resolves each fault by copying the whole
//!   aligned chunk around it (`chunk_bytes`, default 2 MiB, clipped to the file end, the last page
//!   padded with zeros). A fault inside a layer also counts as a layer hint.
//! - the **background thread** prefetches layers k+1 ..= k+`prefetch_layers` after
//!   `enter_layer(k)`, and otherwise fills the rest in inference order (header, layers, output,
//!   embedding table last), a few chunk reads in flight, yielding to pending faults between chunks. When
//!   every chunk is loaded it stops the handler, unregisters, collapses to huge pages, makes the
//!   region read-only, pins it, and records the time.
//!
//! Both threads run at nice −5 where permitted ([`LOADER_NICE`]), so that they wake promptly
//! while the compute threads hold the cores.
//!
//! Every chunk is claimed in an atomic bitmap before it is read, so no byte is read twice; a fault
//! on a chunk another thread is filling just waits for that thread's `UFFDIO_COPY`, which wakes it.
//! After a copy the file's page-cache pages are dropped (no double residency). A read error
//! (truncated or vanished file) sets a sticky error, and every unloaded chunk is then zero-mapped
//! so that no reader ever hangs; the region is left unpinned and `wait_resident` returns the error.
//! Cost: two threads and [`CHUNK_BUFFERS`] (three) chunk buffers during the load (the
//! background thread keeps two chunk reads in flight, the fault handler reads one); one pread
//! + one UFFDIO_COPY per chunk.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags};
use rustix::io::Errno;

use crate::error::{ErrorKind, MemoryError};
use crate::layout::{ChunkPlan, RegionLayout};
use crate::loader::{LoadOptions, LoaderKind};
use crate::region::{
    ChunkBitmap, FinalizeOptions, Memory, ModelRegion, NO_LAYER, Notice, NoticeKind, Shared,
    Status, errno_name, finalize_anonymous, huge_pages_usable,
};
use crate::storage::{Storage, sleep_until};
use crate::sys::{self, AnonMapping};
use crate::transform::{ContextBuffers, Transform};
use crate::uffd::Userfaultfd;

/// Why the lazy loader could not start.
pub(crate) enum StartError {
    /// userfaultfd is not usable here: fall back to mmap (the storage is handed back).
    Unavailable { storage: Storage, reason: String },
    /// Something else failed: report it.
    Fatal(MemoryError),
}

impl From<MemoryError> for StartError {
    fn from(e: MemoryError) -> Self {
        StartError::Fatal(e)
    }
}

/// Registers a new region and starts the handler and background threads.
pub(crate) fn start(
    storage: Storage,
    layout: &RegionLayout,
    chunk_bytes: u64,
    o: &LoadOptions,
    huge_page_size: usize,
    started: Instant,
) -> std::result::Result<Arc<ModelRegion>, StartError> {
    let uffd = match Userfaultfd::open() {
        Ok(u) => u,
        Err(e) => {
            return Err(StartError::Unavailable {
                storage,
                reason: format!("userfaultfd unavailable ({})", errno_name(e)),
            });
        }
    };
    let file_len = layout.file_len;
    let map = AnonMapping::new(file_len as usize, huge_page_size)
        .map_err(|e| MemoryError::with_errno(ErrorKind::Map, "anonymous model region", e))?;
    // SAFETY: `map` is a private anonymous mapping we just created; nothing references its bytes
    // yet, and from now on they are defined only by this userfaultfd's COPY/ZEROPAGE.
    let ioctls = match unsafe { uffd.register_missing(map.addr(), map.len()) } {
        Ok(i) => i,
        Err(e) => {
            return Err(StartError::Unavailable {
                storage,
                reason: format!("UFFDIO_REGISTER refused ({})", errno_name(e)),
            });
        }
    };
    use linux_raw_sys::general::{_UFFDIO_COPY, _UFFDIO_WAKE, _UFFDIO_ZEROPAGE};
    let needed = (1u64 << _UFFDIO_COPY) | (1u64 << _UFFDIO_ZEROPAGE) | (1u64 << _UFFDIO_WAKE);
    if ioctls & needed != needed {
        return Err(StartError::Unavailable {
            storage,
            reason: "userfaultfd lacks UFFDIO_COPY/ZEROPAGE on anonymous memory".into(),
        });
    }
    let wake_fd = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
        .map_err(|e| MemoryError::with_errno(ErrorKind::Userfaultfd, "eventfd", e))?;
    let shared = Arc::new(Shared::new(
        LoaderKind::Lazy,
        file_len,
        chunk_bytes,
        Some(wake_fd),
        started,
    ));
    let plan = ChunkPlan::new(layout, chunk_bytes);
    let map = Arc::new(map);
    let worker = Arc::new(Worker {
        claimed: ChunkBitmap::new(plan.chunk_count),
        shared: shared.clone(),
        map: map.clone(),
        uffd,
        storage,
        plan,
        pending_faults: AtomicUsize::new(0),
        handler_stop: AtomicBool::new(false),
        prefetch_layers: o.prefetch_layers,
        background_fill: o.background_fill,
        filler_bytes_per_s: o.filler_bytes_per_s,
        page_size: sys::page_size(),
        finalize: FinalizeOptions::from_load(o, huge_page_size),
        collapse_early: huge_pages_usable(&FinalizeOptions::from_load(o, huge_page_size)),
        fault_filled: Mutex::new(Vec::new()),
        transform: o.transform.clone(),
    });
    let spawn_err =
        |e: std::io::Error| MemoryError::with_io(ErrorKind::Userfaultfd, "spawn loader thread", e);
    let w = worker.clone();
    let handler = std::thread::Builder::new()
        .name("airs-uffd".into())
        .spawn(move || w.handle_faults())
        .map_err(spawn_err)?;
    let background = std::thread::Builder::new()
        .name("airs-loader".into())
        .spawn(move || worker.run_background(handler));
    let background = match background {
        Ok(b) => b,
        Err(e) => {
            // The handler was detached with the failed closure: stop it.
            shared.stop.store(true, Ordering::Release);
            shared.wake_threads();
            return Err(spawn_err(e).into());
        }
    };
    let _ = shared.worker.set(background.thread().clone());
    Ok(Arc::new(ModelRegion::from_parts(
        Memory::Anon(map),
        shared,
        Some(background),
        huge_page_size,
        o.transform.clone(),
    )))
}

/// What the handler and background threads share.
struct Worker {
    /// Rewrites each chunk between its read and its copy into the region.
    transform: Option<Transform>,
    shared: Arc<Shared>,
    map: Arc<AnonMapping>,
    uffd: Userfaultfd,
    storage: Storage,
    plan: ChunkPlan,
    /// Chunks some thread has taken on (filled or being filled).
    claimed: ChunkBitmap,
    /// Faults read from the descriptor and not yet resolved (the filler yields to them).
    pending_faults: AtomicUsize,
    handler_stop: AtomicBool,
    prefetch_layers: u32,
    background_fill: bool,
    filler_bytes_per_s: Option<u64>,
    page_size: usize,
    finalize: FinalizeOptions,
    /// Collapse each huge-page block to a huge page as soon as the background thread completes
    /// it, so that little is left to collapse (copy) when the load finishes.
    collapse_early: bool,
    /// Chunks the fault handler filled, whose huge-page blocks the background thread collapses
    /// when no fault is waiting (the handler itself never spends time collapsing).
    fault_filled: Mutex<Vec<usize>>,
}

/// A chunk whose read was issued (and booked on the paced device) but not yet copied in.
struct PendingChunk {
    chunk: usize,
    buf: Vec<u8>,
    /// The file's bytes around the chunk that the transform asked for.
    context: ContextBuffers,
    /// The read's result and when the device delivers it (chunk and context); `None` when an
    /// earlier error means the chunk is to be zero-mapped.
    read: Option<Result<Option<Instant>, MemoryError>>,
}

/// What [`Worker::next_fill`] found.
enum NextFill {
    /// This chunk, now claimed by the caller.
    Chunk(usize),
    /// A candidate another thread claimed first: look again at once.
    Raced,
    /// Nothing to fill now.
    Nothing,
}

/// Nice value of the loader threads: they use little CPU, but every late wake-up while the
/// compute threads hold the cores leaves the device idle. Applied where permitted (root or
/// CAP_SYS_NICE); elsewhere the threads keep the default.
const LOADER_NICE: i32 = -5;

/// Chunk reads the background thread keeps booked on the device ahead of its copy. Two cover a
/// late wake-up of up to one chunk's transfer time (21 ms for 2 MiB at 100 MB/s) while both
/// cores compute; a fault's read waits behind at most these.
const READS_IN_FLIGHT: usize = 2;

/// Chunk buffers a lazy load holds at most: the background thread's reads in flight (it
/// reuses the buffer of each chunk it finishes) and the fault handler's one. Each chunk in
/// flight may also carry a transform's context ([`crate::max_context_bytes`] a side).
pub const CHUNK_BUFFERS: usize = READS_IN_FLIGHT + 1;

enum Outcome {
    Done,
    Failed,
    Stopped,
}

impl Worker {
    /// Fault-handler thread: poll, read fault messages, resolve them.
    fn handle_faults(&self) {
        sys::set_this_thread_nice(LOADER_NICE);
        let mut buf = Vec::new();
        let mut faults = Vec::new();
        let Some(wake_fd) = self.shared.wake_fd.as_ref() else {
            return;
        };
        loop {
            if self.handler_stop.load(Ordering::Acquire) || self.shared.stop.load(Ordering::Acquire)
            {
                return;
            }
            let mut fds = [
                PollFd::new(&self.uffd, PollFlags::IN),
                PollFd::new(wake_fd, PollFlags::IN),
            ];
            match rustix::event::poll(&mut fds, None) {
                Ok(_) | Err(Errno::INTR) => {}
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
            if fds[1].revents().contains(PollFlags::IN) {
                let mut counter = [0u8; 8];
                let _ = rustix::io::read(wake_fd, &mut counter);
            }
            faults.clear();
            while let Ok(Some(event)) = self.uffd.read_event() {
                if let crate::uffd::Event::PageFault { address, .. } = event {
                    faults.push(address as usize);
                }
            }
            self.pending_faults.store(faults.len(), Ordering::Release);
            for &address in &faults {
                self.on_fault(address, &mut buf);
                self.pending_faults.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    fn on_fault(&self, address: usize, buf: &mut Vec<u8>) {
        let offset = address.wrapping_sub(self.map.addr());
        if offset >= self.map.len() {
            return;
        }
        if let Some(layer) = self.plan.layer_at(offset as u64)
            && self.shared.layer_hint.swap(layer, Ordering::AcqRel) != layer
            && let Some(t) = self.shared.worker.get()
        {
            t.unpark();
        }
        let chunk = offset / self.plan.chunk_bytes as usize;
        if self.claimed.try_set(chunk) {
            self.fill_chunk(chunk, buf);
            if self.collapse_early {
                self.fault_filled
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(chunk);
            }
        } else if self.shared.filled.get(chunk) {
            // Stale message: the page is there; make sure the faulting thread is awake.
            let page = address & !(self.page_size - 1);
            let _ = self.uffd.wake(page, self.page_size);
        }
        // Otherwise another thread is filling the chunk; it wakes the range after its copy.
    }

    /// Loads chunk `c` (already claimed by the caller) into the region.
    fn fill_chunk(&self, c: usize, buf: &mut Vec<u8>) {
        let pending = self.begin_chunk(c, std::mem::take(buf));
        *buf = self.finish_chunk(pending);
    }

    /// Issues the read of chunk `c` (already claimed by the caller) into `buf`, booking its time
    /// on the paced device, without waiting for it.
    fn begin_chunk(&self, c: usize, mut buf: Vec<u8>) -> PendingChunk {
        let r = self.plan.chunk_range(c, self.shared.file_len);
        let (offset, len) = (r.start as usize, (r.end - r.start) as usize);
        let copy_len = sys::round_up(len, self.page_size).min(self.map.len() - offset);
        let mut context = ContextBuffers::default();
        let read = if self.shared.error.get().is_none() {
            if buf.len() < copy_len {
                buf.resize(copy_len, 0);
            }
            let chunk_read = self.storage.read_booked(r.start, &mut buf[..len]);
            Some(match &self.transform {
                Some(t) => chunk_read.and_then(|ready| {
                    let around =
                        context.read(&self.storage, &*t.0, r.clone(), self.shared.file_len)?;
                    Ok(ready.max(around))
                }),
                None => chunk_read,
            })
        } else {
            None
        };
        PendingChunk {
            chunk: c,
            buf,
            context,
            read,
        }
    }

    /// Waits for the device to deliver a chunk begun by [`Worker::begin_chunk`], copies it into
    /// the region and wakes its readers (or zero-maps it after an error). Returns the buffer.
    fn finish_chunk(&self, pending: PendingChunk) -> Vec<u8> {
        let PendingChunk {
            chunk: c,
            mut buf,
            context,
            read,
        } = pending;
        let r = self.plan.chunk_range(c, self.shared.file_len);
        let (offset, len) = (r.start as usize, (r.end - r.start) as usize);
        let copy_len = sys::round_up(len, self.page_size).min(self.map.len() - offset);
        if let Some(read) = read {
            let ready = read.map(|ready_at| {
                if let Some(t) = ready_at {
                    sleep_until(t);
                }
            });
            if self.shared.error.get().is_none() {
                let loaded = ready.and_then(|()| {
                    if let Some(t) = &self.transform {
                        t.0.apply(r.start, &mut buf[..len], context.get());
                    }
                    buf[len..copy_len].fill(0);
                    self.uffd
                        .copy_all(self.map.addr() + offset, &buf[..copy_len], self.page_size)
                        .map_err(|e| {
                            MemoryError::with_errno(
                                ErrorKind::Userfaultfd,
                                format!("UFFDIO_COPY at offset {offset}"),
                                e,
                            )
                        })
                });
                match loaded {
                    Ok(_) => {
                        // Publish the chunk before waking its readers, so that a reader that sees
                        // the bytes also sees them counted.
                        self.done(c, len as u64);
                        let _ = self.uffd.wake(self.map.addr() + offset, copy_len);
                        self.storage.drop_cache(r.start, len as u64);
                        return buf;
                    }
                    Err(e) => self.fail(e),
                }
            }
        }
        self.zero_fill(offset, copy_len);
        self.done(c, 0);
        buf
    }

    fn done(&self, c: usize, bytes: u64) {
        self.shared.mark_filled(c, bytes);
        if (self.shared.all_filled() || self.shared.error.get().is_some())
            && let Some(t) = self.shared.worker.get()
        {
            t.unpark();
        }
    }

    /// Records the first error; from then on chunks are zero-mapped instead of read.
    fn fail(&self, e: MemoryError) {
        let message = format!("lazy load failed ({e}); bytes not yet loaded read as zeros");
        if self.shared.error.set(e).is_ok() {
            self.shared
                .notice(Notice::new(NoticeKind::LoadFailed, message));
        }
        if let Some(t) = self.shared.worker.get() {
            t.unpark();
        }
    }

    /// Resolves `[offset, offset + len)` without data so readers never hang.
    fn zero_fill(&self, offset: usize, len: usize) {
        let dst = self.map.addr() + offset;
        if self.uffd.zeropage(dst, len).is_err() {
            let zeros = vec![0u8; len];
            let _ = self.uffd.copy_all(dst, &zeros, self.page_size);
            let _ = self.uffd.wake(dst, len);
        }
    }

    /// Background thread: prefetch, fill, finalize.
    fn run_background(self: Arc<Self>, handler: JoinHandle<()>) {
        sys::set_this_thread_nice(LOADER_NICE);
        let outcome = self.fill_loop();
        self.handler_stop.store(true, Ordering::Release);
        self.shared.wake_threads();
        let _ = handler.join();
        match outcome {
            Outcome::Stopped => {}
            Outcome::Done => {
                let _ = self.uffd.unregister(self.map.addr(), self.map.len());
                finalize_anonymous(&self.map, &self.shared, self.finalize);
                self.shared.set_status(Status::Resident);
            }
            Outcome::Failed => {
                let _ = self.uffd.unregister(self.map.addr(), self.map.len());
                if self.map.make_read_only().is_ok() {
                    self.shared.read_only.store(true, Ordering::Release);
                }
                self.shared.set_status(Status::Failed);
            }
        }
    }

    /// The background thread's loop. It keeps up to [`READS_IN_FLIGHT`] chunk reads booked on
    /// the device ahead of the chunk it is copying into the region, so the (paced) device does
    /// not idle while the thread copies, collapses, or waits for a CPU.
    fn fill_loop(&self) -> Outcome {
        let mut spare: Vec<Vec<u8>> = Vec::new();
        let mut in_flight: VecDeque<PendingChunk> = VecDeque::with_capacity(READS_IN_FLIGHT);
        let mut cursor = 0;
        let mut filler_next = Instant::now();
        loop {
            if self.shared.stop.load(Ordering::Acquire) {
                return Outcome::Stopped;
            }
            if self.shared.error.get().is_some() {
                while let Some(p) = in_flight.pop_front() {
                    spare.push(self.finish_chunk(p));
                }
                for c in 0..self.plan.chunk_count {
                    if self.claimed.try_set(c) {
                        let r = self.plan.chunk_range(c, self.shared.file_len);
                        let len = sys::round_up((r.end - r.start) as usize, self.page_size);
                        self.zero_fill(
                            r.start as usize,
                            len.min(self.map.len() - r.start as usize),
                        );
                        self.done(c, 0);
                    }
                }
                if self.shared.all_filled() {
                    return Outcome::Failed;
                }
                std::thread::park_timeout(Duration::from_millis(1));
                continue;
            }
            if in_flight.is_empty() && self.shared.all_filled() {
                return Outcome::Done;
            }
            let fault_filled =
                std::mem::take(&mut *self.fault_filled.lock().unwrap_or_else(|e| e.into_inner()));
            for c in fault_filled {
                self.collapse_completed_blocks(c);
            }
            // Book new reads unless a fault is waiting (faults go first for new reads; the reads
            // already booked complete, and a fault may be waiting for one of them).
            let mut raced = false;
            while in_flight.len() < READS_IN_FLIGHT
                && self.pending_faults.load(Ordering::Acquire) == 0
            {
                match self.next_fill(&mut cursor, &mut filler_next) {
                    NextFill::Chunk(c) => {
                        let buf = spare.pop().unwrap_or_default();
                        in_flight.push_back(self.begin_chunk(c, buf));
                    }
                    NextFill::Raced => raced = true,
                    NextFill::Nothing => break,
                }
            }
            if let Some(p) = in_flight.pop_front() {
                let c = p.chunk;
                spare.push(self.finish_chunk(p));
                self.collapse_completed_blocks(c);
            } else if self.pending_faults.load(Ordering::Acquire) > 0 {
                std::thread::sleep(Duration::from_micros(50));
            } else if !raced {
                let now = Instant::now();
                let wait = if self.background_fill && filler_next > now {
                    (filler_next - now).min(Duration::from_millis(50))
                } else {
                    Duration::from_millis(50)
                };
                std::thread::park_timeout(wait);
            }
        }
    }

    /// Claims the next chunk for the background thread: the first unclaimed chunk of the layers
    /// prefetched after the hint, else (with the background fill on, and within its pace) the
    /// next unclaimed chunk in fill order.
    fn next_fill(&self, cursor: &mut usize, filler_next: &mut Instant) -> NextFill {
        if let Some(c) = self.next_prefetch() {
            return if self.claimed.try_set(c) {
                NextFill::Chunk(c)
            } else {
                NextFill::Raced
            };
        }
        if !self.background_fill {
            return NextFill::Nothing;
        }
        let order = &self.plan.fill_order;
        while *cursor < order.len() && self.claimed.get(order[*cursor] as usize) {
            *cursor += 1;
        }
        let now = Instant::now();
        if *cursor >= order.len() || now < *filler_next {
            return NextFill::Nothing;
        }
        let c = order[*cursor] as usize;
        if let Some(&after) = order.get(*cursor + 1)
            && !self.claimed.get(after as usize)
        {
            // Let a real device read ahead too.
            let r = self.plan.chunk_range(after as usize, self.shared.file_len);
            self.storage.will_need(r.start, r.end - r.start);
        }
        if !self.claimed.try_set(c) {
            return NextFill::Raced;
        }
        if let Some(rate) = self.filler_bytes_per_s {
            let r = self.plan.chunk_range(c, self.shared.file_len);
            let cost = (r.end - r.start) as f64 / rate.max(1) as f64;
            *filler_next = (*filler_next).max(now) + Duration::from_secs_f64(cost);
        }
        NextFill::Chunk(c)
    }

    /// Collapses the huge-page blocks overlapping chunk `c` that are now completely loaded.
    /// MADV_COLLAPSE works on a userfaultfd-armed range once every page of the block is present.
    fn collapse_completed_blocks(&self, c: usize) {
        if !self.collapse_early || self.shared.error.get().is_some() {
            return;
        }
        let huge = self.finalize.huge_page_size as u64;
        let whole_blocks_end = self.map.len() as u64 / huge * huge;
        let cb = self.plan.chunk_bytes;
        let r = self.plan.chunk_range(c, self.shared.file_len);
        for block in r.start / huge..=(r.end - 1) / huge {
            let (start, end) = (block * huge, (block + 1) * huge);
            if end > whole_blocks_end {
                break;
            }
            let last_chunk = ((end - 1) / cb).min(self.plan.chunk_count as u64 - 1);
            if (start / cb..=last_chunk).all(|c| self.shared.filled.get(c as usize)) {
                let _ = self.map.collapse(start as usize, huge as usize);
            }
        }
    }

    /// First unclaimed chunk of the layers after the current hint, in order.
    fn next_prefetch(&self) -> Option<usize> {
        let hint = self.shared.layer_hint.load(Ordering::Acquire);
        if hint == NO_LAYER {
            return None;
        }
        (hint.saturating_add(1)..=hint.saturating_add(self.prefetch_layers))
            .map_while(|l| self.plan.layer_chunks.get(l as usize))
            .flatten()
            .map(|&c| c as usize)
            .find(|&c| !self.claimed.get(c))
    }
}
