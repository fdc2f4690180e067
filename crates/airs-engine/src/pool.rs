//! A fixed pool of worker threads for the kernels: the caller's thread plus `threads - 1`
//! workers run one job at a time. A job's chunks of work are dealt as one contiguous run per
//! thread, taken front to back (for a matrix product's rows, in bites of half of what is left,
//! so a thread enters the kernels a few times per run, not once per chunk), and a thread done
//! with its own run takes the others' last chunks one at a time, so a slow core (these
//! machines are noisy) takes fewer chunks while each thread reads one sequential stream of a
//! weight matrix, which the hardware prefetchers follow (handing chunks out in turn through
//! one counter started a new stream every chunk: BENCHMARKS.md).
//!
//! A job may say what each thread reads first in the job after it ([`ReadAhead`]): a thread
//! with nothing left to take prefetches that into its L2 while it waits, for the others at the
//! job's end or for the caller's serial work before the next job (a decode step's norms,
//! activation quantization and short attention), so memory is not idle between two matrix
//! products. On the AMX host (`bench decode --alternate-read-ahead 0,512`, 1,024 steps), steps
//! took 1.2-1.6 % less time on Qwen2.5-0.5B and TinyLlama-1.1B Q4_K_M and Q8_0
//! (BENCHMARKS.md).
//!
//! Design: like ggml's threadpool, workers spin briefly on an epoch counter after each job
//! (matmuls in a forward pass are microseconds apart) and then sleep on a condition variable,
//! so an idle engine burns no CPU. Cost per job: one mutex lock per worker plus a
//! compare-and-swap per chunk (on the thread's own cache line until it takes others'), and a
//! wake-up call only when a worker sleeps; no allocation. The thread count is explicit:
//! nothing reads the environment.

use std::any::Any;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it sleeps.
const SPIN: Duration = Duration::from_micros(200);

/// A job as the workers see it: the closure with its lifetime erased (see `run`).
type Job = &'static (dyn Fn(usize) + Sync);

struct State {
    epoch: u64,
    job: Option<Job>,
    /// What each thread reads first in the job after this one (empty: nothing known).
    ahead: Vec<ReadAhead>,
    /// Workers waiting on `Shared::wake` (counted under this lock).
    sleepers: usize,
    shutdown: bool,
    panic: Option<Box<dyn Any + Send>>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// Mirror of `state.epoch` for lock-free spinning.
    epoch: AtomicUsize,
    /// Workers that have not finished the current job.
    remaining: AtomicUsize,
}

/// How finely the matrix products' rows are dealt to the threads ([`crate::par`]): row
/// chunks a thread gets of a product of one input row and of several. Read once per product
/// and settable at any time (relaxed atomics), so that `airs bench decode --alternate-chunks`
/// can switch them between two steps and measure both within one run. Any count gives the
/// same results: only the speed differs.
#[derive(Debug)]
pub struct ChunksPerThread {
    one_token: AtomicUsize,
    several_tokens: AtomicUsize,
}

impl ChunksPerThread {
    /// The default for one token's product, which streams its weights at the memory's rate:
    /// eight, taken by their owner in bites of half of what is left (4, 2, 1, 1), so that a
    /// thread done early finds an eighth of a slow core's share to take while the owner
    /// enters the kernels four times. In alternation within one run (`bench decode
    /// --alternate-chunks 2,8`, 1,024 steps, Zen 3, 2 threads) eight took 2.0-2.6 % less time
    /// a step than two on TinyLlama-1.1B Q4_K_M and Q8_0, and 0.8 % less on Qwen2.5-0.5B
    /// (BENCHMARKS.md). When every chunk was a call of its own, eight had been 1.5-4 %
    /// slower than two on an earlier host state (3 % faster on this one), and 32 6-10 %
    /// slower: the bites keep the owner's first half one call, as with two.
    pub const ONE_TOKEN: usize = 8;

    /// The default for a product of several tokens: enough that a thread done early takes a
    /// slow core's last ones (these machines are noisy), since such a product is bound by the
    /// multipliers and every core's share counts (2, 4 and 16 measured within 1 % of it).
    pub const SEVERAL_TOKENS: usize = 8;

    /// Chunks a thread for a product of `tokens` input rows.
    pub fn of(&self, tokens: usize) -> usize {
        let count = if tokens == 1 {
            &self.one_token
        } else {
            &self.several_tokens
        };
        count.load(Ordering::Relaxed)
    }

    /// Deal one token's products in `chunks` chunks a thread (at least one) from the next
    /// product on.
    pub fn set_one_token(&self, chunks: usize) {
        self.one_token.store(chunks.max(1), Ordering::Relaxed);
    }

    /// Deal several tokens' products in `chunks` chunks a thread (at least one) from the next
    /// product on.
    pub fn set_several_tokens(&self, chunks: usize) {
        self.several_tokens.store(chunks.max(1), Ordering::Relaxed);
    }
}

impl Default for ChunksPerThread {
    fn default() -> ChunksPerThread {
        ChunksPerThread {
            one_token: AtomicUsize::new(Self::ONE_TOKEN),
            several_tokens: AtomicUsize::new(Self::SEVERAL_TOKENS),
        }
    }
}

/// A pool of `threads` threads (the caller counts as one).
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    threads: usize,
    chunks_per_thread: ChunksPerThread,
    /// Bytes of the next job a thread prefetches at the end of the current one
    /// ([`ThreadPool::read_ahead_bytes`]).
    read_ahead_bytes: AtomicUsize,
    /// Serializes `run` calls from different threads sharing one pool.
    run_lock: Mutex<()>,
}

impl ThreadPool {
    /// A pool that runs jobs on `threads` threads (at least 1).
    pub fn new(threads: usize) -> ThreadPool {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                epoch: 0,
                job: None,
                ahead: Vec::with_capacity(threads),
                sleepers: 0,
                shutdown: false,
                panic: None,
            }),
            wake: Condvar::new(),
            epoch: AtomicUsize::new(0),
            remaining: AtomicUsize::new(0),
        });
        let workers = (1..threads)
            .map(|index| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("airs-worker-{index}"))
                    .spawn(move || worker(&shared, index))
                    .expect("spawning a worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            threads,
            chunks_per_thread: ChunksPerThread::default(),
            read_ahead_bytes: AtomicUsize::new(Self::READ_AHEAD_BYTES),
            run_lock: Mutex::new(()),
        }
    }

    /// Number of threads jobs run on.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// How finely the products run on this pool are dealt.
    pub fn chunks_per_thread(&self) -> &ChunksPerThread {
        &self.chunks_per_thread
    }

    /// The default of [`ThreadPool::read_ahead_bytes`]: the smallest L2 a core has on the
    /// machines served (the Pi 5's 512 KiB; the Pi 4's 1 MiB is shared by its four cores). A
    /// thread rarely gets that far: the next job's start ends its prefetches, and a decode
    /// step's products are microseconds apart (on the AMX host 256 → 512 KiB still took
    /// 0.3 % off a step, 512 → 2,048 as much). Unmeasured on the Pi.
    pub const READ_AHEAD_BYTES: usize = 512 << 10;

    /// Bytes of the next job's weights a thread prefetches while it waits at the end of the
    /// current one, when the caller says what they are ([`ReadAhead`]). Read once per job and
    /// settable at any time, so that `airs bench decode --alternate-read-ahead` can switch it
    /// between two steps; 0: none. Any value gives the same results: only the speed differs.
    pub fn read_ahead_bytes(&self) -> usize {
        self.read_ahead_bytes.load(Ordering::Relaxed)
    }

    /// Prefetch `bytes` of the next job a thread from the next job on.
    pub fn set_read_ahead_bytes(&self, bytes: usize) {
        self.read_ahead_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Run `job(thread_index)` once on every thread of the pool and wait for all of them.
    pub fn run(&self, job: &(dyn Fn(usize) + Sync)) {
        self.run_ahead(job, &[]);
    }

    /// [`ThreadPool::run`], with what each thread will read first in the next job
    /// (`ahead[thread_index]`, if given), which a thread done with this job prefetches while
    /// it waits ([`ReadAhead`]).
    pub fn run_ahead(&self, job: &(dyn Fn(usize) + Sync), ahead: &[ReadAhead]) {
        if self.threads == 1 {
            job(0);
            return;
        }
        let _serial = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the erased reference is only dereferenced by workers between the epoch bump
        // below and their decrement of `remaining`; this function does not return (or unwind)
        // before `remaining` is 0 and the job slot is cleared, so `job` outlives every use.
        let erased: Job = unsafe {
            std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(job)
        };
        self.shared
            .remaining
            .store(self.threads - 1, Ordering::SeqCst);
        let sleepers = {
            let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            state.job = Some(erased);
            state.ahead.clear();
            state.ahead.extend_from_slice(ahead);
            state.epoch += 1;
            self.shared
                .epoch
                .store(state.epoch as usize, Ordering::SeqCst);
            state.sleepers
        };
        // A worker still spinning sees the epoch; one asleep needs the condition variable.
        // Read under the lock that the sleepers count and wait under, so none is missed; a
        // futex wake-up on every job cost 0.4-0.7 % of a decode step (BENCHMARKS.md).
        if sleepers > 0 {
            self.shared.wake.notify_all();
        }
        let own = catch_unwind(AssertUnwindSafe(|| job(0)));
        if let Some(mine) = ahead.first() {
            mine.prefetch_while(|| self.shared.remaining.load(Ordering::Acquire) != 0);
        }
        let started = Instant::now();
        let mut spins = 0u32;
        while self.shared.remaining.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins.is_multiple_of(64) && started.elapsed() > SPIN {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        let worker_panic = {
            let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            state.job = None;
            state.panic.take()
        };
        if let Err(p) = own {
            resume_unwind(p);
        }
        if let Some(p) = worker_panic {
            resume_unwind(p);
        }
    }

    /// Split `0..items` into chunks of `chunk` items and run `f(range)` for every chunk, spread
    /// over the pool's threads: thread `t` takes the `t`-th contiguous run of chunks front to
    /// back, then the other runs' remaining chunks from their backs (module documentation).
    pub fn for_chunks(&self, items: usize, chunk: usize, f: &(dyn Fn(Range<usize>) + Sync)) {
        self.for_chunks_as(items, chunk, Take::OneByOne, &[], f);
    }

    /// [`ThreadPool::for_chunks`], each thread taking its own run as `take` says, and
    /// prefetching `ahead[thread_index]` once it has no chunk left to take
    /// ([`ThreadPool::run_ahead`]).
    pub fn for_chunks_as(
        &self,
        items: usize,
        chunk: usize,
        take: Take,
        ahead: &[ReadAhead],
        f: &(dyn Fn(Range<usize>) + Sync),
    ) {
        let chunk = chunk.max(1);
        let chunks = items.div_ceil(chunk);
        if chunks <= 1 || self.threads == 1 {
            if items > 0 {
                f(0..items);
            }
            return;
        }
        let run_chunks = |c: Range<usize>| f(c.start * chunk..(c.end * chunk).min(items));
        let (owners, per) = self.runs_of(chunks);
        assert!(
            u32::try_from(chunks).is_ok(),
            "{chunks} chunks: more than a run word holds"
        );
        let runs: [ChunkRun; MAX_RUNS] = std::array::from_fn(|t| {
            ChunkRun::new((t * per).min(chunks), ((t + 1) * per).min(chunks))
        });
        self.run_ahead(
            &|thread| {
                let me = thread % owners;
                loop {
                    let own = match take {
                        Take::OneByOne => runs[me].take_front(),
                        Take::InBites => runs[me].take_front_half(),
                    };
                    let Some(c) = own else { break };
                    run_chunks(c);
                }
                for k in 1..owners {
                    let other = &runs[(me + k) % owners];
                    while let Some(c) = other.take_back() {
                        run_chunks(c..c + 1);
                    }
                }
            },
            ahead,
        );
    }

    /// The chunk each thread takes first when [`ThreadPool::for_chunks_as`] deals `chunks`
    /// chunks (the front of its own run), by thread index: where a caller that knows the
    /// next job's chunks finds what each thread reads first ([`ReadAhead`]).
    pub fn first_chunks(&self, chunks: usize) -> impl Iterator<Item = usize> {
        let (owners, per) = self.runs_of(chunks);
        (0..self.threads).map(move |thread| ((thread % owners) * per).min(chunks))
    }

    /// How `chunks` chunks are dealt: to how many runs, of how many chunks each (the last
    /// run may be shorter). Beyond `MAX_RUNS` threads, several take one run's front (a
    /// compare-and-swap claims each chunk once either way).
    fn runs_of(&self, chunks: usize) -> (usize, usize) {
        let owners = self.threads.min(MAX_RUNS);
        (owners, chunks.div_ceil(owners))
    }
}

/// What one thread reads first in the pool's next job: up to two byte ranges (a gated
/// product reads the same rows of two matrices), which the thread prefetches into its L2 once
/// it has nothing left of the current job, until the next one starts (workers) or every
/// worker is done (the caller). Addresses are kept as numbers: a prefetch never faults, so a
/// range that is gone by the time it is read costs nothing but the hint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadAhead {
    ranges: [(usize, usize); 2],
}

impl ReadAhead {
    /// Bytes prefetched between two checks of whether to go on: 64 lines, ~0.3 µs of one
    /// core's reads, so a thread starts the next job at most that late.
    const STEP_BYTES: usize = 4096;

    /// Ahead reads of `ranges` (start, bytes); at most two are kept.
    pub fn new(ranges: &[(*const u8, usize)]) -> ReadAhead {
        let mut ahead = ReadAhead::default();
        for (slot, &(start, bytes)) in ahead.ranges.iter_mut().zip(ranges) {
            *slot = (start as usize, bytes);
        }
        ahead
    }

    /// The ranges, as (start address, bytes).
    pub fn ranges(&self) -> [(usize, usize); 2] {
        self.ranges
    }

    /// Prefetch the ranges a step at a time while `go_on()` says so.
    fn prefetch_while(&self, mut go_on: impl FnMut() -> bool) {
        for (start, bytes) in self.ranges {
            for at in (0..bytes).step_by(Self::STEP_BYTES) {
                if !go_on() {
                    return;
                }
                let step = Self::STEP_BYTES.min(bytes - at);
                airs_kernels::prefetch::to_l2((start + at) as *const u8, step);
            }
        }
    }
}

/// How each thread takes its own run of a job's chunks ([`ThreadPool::for_chunks_as`]); the
/// others' chunks it takes one at a time either way.
#[derive(Clone, Copy, Debug)]
pub enum Take {
    /// One chunk a call: chunks of unequal work (attention's, whose later positions cost
    /// more: a bite would keep the cheap run's thread out of half of the expensive one's),
    /// or whose size per call was measured as it is (the tiled products' tiles).
    OneByOne,
    /// Half of what is left of the run a call (one call of `f` for several chunks, so a
    /// thread enters the kernels a few times a run): chunks of equal work, a matrix
    /// product's rows.
    InBites,
}

/// Contiguous runs [`ThreadPool::for_chunks`] deals at most (one per thread up to this).
const MAX_RUNS: usize = 64;

/// The chunks `front..back` of one thread's run not yet taken, as one word (`front` in the
/// low 32 bits) so that the owner taking the front and a thief taking the back never take the
/// same chunk. On its own cache line: the owner's updates do not slow the other owners.
#[repr(align(64))]
struct ChunkRun(AtomicU64);

impl ChunkRun {
    fn new(front: usize, back: usize) -> ChunkRun {
        ChunkRun(AtomicU64::new(front as u64 | (back as u64) << 32))
    }

    /// Take the first chunk left, if any.
    fn take_front(&self) -> Option<Range<usize>> {
        self.take(|front, back| (front..front + 1, (front + 1, back)))
    }

    /// Take the first half of the chunks left (at least one), if any: the owner's bites, so
    /// that it enters the kernels once for most of its run while thieves, one chunk at a
    /// time, still find the last ones small.
    fn take_front_half(&self) -> Option<Range<usize>> {
        self.take(|front, back| {
            let end = front + (back - front).div_ceil(2);
            (front..end, (end, back))
        })
    }

    /// Take the last chunk left, if any.
    fn take_back(&self) -> Option<usize> {
        self.take(|front, back| (back - 1..back, (front, back - 1)))
            .map(|taken| taken.start)
    }

    /// Claim the chunks `pick(front, back)` names (never empty), leaving the run it returns,
    /// while any chunk is left.
    fn take(&self, pick: impl Fn(u64, u64) -> (Range<u64>, (u64, u64))) -> Option<Range<usize>> {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            let (front, back) = (cur & u64::from(u32::MAX), cur >> 32);
            if front >= back {
                return None;
            }
            let (taken, (front, back)) = pick(front, back);
            match self.0.compare_exchange_weak(
                cur,
                front | back << 32,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(taken.start as usize..taken.end as usize),
                Err(now) => cur = now,
            }
        }
    }
}

fn worker(shared: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        // Spin briefly for the next job, then sleep.
        let started = Instant::now();
        let mut spins = 0u32;
        while shared.epoch.load(Ordering::Acquire) as u64 == seen {
            spins += 1;
            if spins.is_multiple_of(64) && started.elapsed() > SPIN {
                break;
            }
            std::hint::spin_loop();
        }
        let (job, ahead) = {
            let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            while state.epoch == seen && !state.shutdown {
                state.sleepers += 1;
                state = shared.wake.wait(state).unwrap_or_else(|e| e.into_inner());
                state.sleepers -= 1;
            }
            if state.shutdown {
                return;
            }
            seen = state.epoch;
            (state.job, state.ahead.get(index).copied())
        };
        if let Some(job) = job
            && let Err(p) = catch_unwind(AssertUnwindSafe(|| job(index)))
        {
            shared.state.lock().unwrap_or_else(|e| e.into_inner()).panic = Some(p);
        }
        shared.remaining.fetch_sub(1, Ordering::AcqRel);
        if let Some(ahead) = ahead {
            ahead.prefetch_while(|| shared.epoch.load(Ordering::Acquire) as u64 == seen);
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .shutdown = true;
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_chunk_runs_exactly_once() {
        // 66: more threads than runs, some sharing one.
        for threads in [1, 2, 3, 4, 66] {
            let pool = ThreadPool::new(threads);
            for items in [0, 1, 7, 64, 1000] {
                for take in [Take::OneByOne, Take::InBites] {
                    let hits: Vec<AtomicU64> = (0..items).map(|_| AtomicU64::new(0)).collect();
                    let count = |r: Range<usize>| {
                        for i in r {
                            hits[i].fetch_add(1, Ordering::Relaxed);
                        }
                    };
                    pool.for_chunks_as(items, 3, take, &[], &count);
                    assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
                }
            }
        }
    }

    #[test]
    fn every_thread_takes_its_own_run_first() {
        // Two threads, 8 chunks of one item: runs 0..4 (the caller) and 4..8 (the worker).
        // Each starts at the front of its own run; the caller steals from the back of the
        // worker's, so the worker, if it runs anything, starts at 4.
        let pool = ThreadPool::new(2);
        let caller = std::thread::current().id();
        for _ in 0..100 {
            let firsts = Mutex::new(Vec::new());
            pool.for_chunks(8, 1, &|r| {
                let me = std::thread::current().id();
                let mut firsts = firsts.lock().unwrap();
                if !firsts.iter().any(|&(t, _)| t == me) {
                    firsts.push((me, r.start));
                }
            });
            for (thread, first) in firsts.into_inner().unwrap() {
                assert_eq!(first, if thread == caller { 0 } else { 4 });
            }
        }
    }

    #[test]
    fn an_owner_takes_half_of_what_is_left_each_time() {
        let run = ChunkRun::new(0, 8);
        let bites: Vec<Range<usize>> = std::iter::from_fn(|| run.take_front_half()).collect();
        assert_eq!(bites, [0..4, 4..6, 6..7, 7..8]);
    }

    #[test]
    fn a_run_is_taken_from_both_ends_exactly_once() {
        let run = ChunkRun::new(2, 9);
        assert_eq!(run.take_front(), Some(2..3));
        assert_eq!(run.take_front_half(), Some(3..6));
        assert_eq!(run.take_back(), Some(8));
        assert_eq!(run.take_front_half(), Some(6..7));
        assert_eq!(run.take_back(), Some(7));
        assert_eq!(run.take_front_half(), None);
        assert_eq!(run.take_back(), None);
        assert_eq!(ChunkRun::new(5, 5).take_front_half(), None);
    }

    #[test]
    fn a_worker_asleep_between_jobs_is_woken_for_the_next() {
        let pool = Arc::new(ThreadPool::new(3));
        for _ in 0..10 {
            // Long enough for the workers to stop spinning and wait on the condition variable.
            std::thread::sleep(SPIN * 20);
            let (done, finished) = std::sync::mpsc::channel();
            let caller = Arc::clone(&pool);
            std::thread::spawn(move || {
                let ran = AtomicU64::new(0);
                caller.run(&|_| {
                    ran.fetch_add(1, Ordering::Relaxed);
                });
                done.send(ran.load(Ordering::Relaxed)).unwrap();
            });
            let ran = finished.recv_timeout(Duration::from_secs(30));
            assert_eq!(
                ran,
                Ok(3),
                "every thread ran the job, the sleeping ones woken"
            );
        }
    }

    #[test]
    fn many_back_to_back_jobs_complete() {
        let pool = ThreadPool::new(2);
        let total = AtomicU64::new(0);
        for _ in 0..10_000 {
            pool.run(&|t| {
                total.fetch_add(t as u64 + 1, Ordering::Relaxed);
            });
        }
        assert_eq!(total.load(Ordering::Relaxed), 10_000 * 3);
    }

    #[test]
    fn a_panicking_job_panics_the_caller_and_the_pool_survives() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|t| {
                if t == 1 {
                    panic!("worker fails");
                }
            })
        }));
        assert!(r.is_err());
        let ran = AtomicU64::new(0);
        pool.run(&|_| {
            ran.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(ran.load(Ordering::Relaxed), 2);
    }
}
