//! How many cores' worth of arithmetic and read bandwidth the pool's threads get right now: the
//! same probes run on one thread and then on all of them, and each all-threads figure divided
//! by the one-thread figure.
//!
//! Why: on a virtual machine the host decides where the vCPUs run, and moves them every few
//! seconds to minutes. On this project's 2-vCPU benchmark host (AMD EPYC, Zen 4) one thread
//! reads 28-34 GB/s on either vCPU whatever the placement, but two threads together read
//! either about 36 GB/s or about 66: consistent with the two vCPUs running on cores of one
//! chiplet, which share its link to memory, or of two. Separately, the int8 dot rate of two
//! threads is sometimes one core's, not two (the vCPUs on the two hardware threads of one
//! core). What earlier notes called a DRAM drifting between slow and fast was this
//! (BENCHMARKS.md, "The slow state is a placement"). A decode at the memory's pace and a
//! batched step at the multiplier's pace then slow down for reasons outside the program, so a
//! speed is only comparable with one measured under the same placement: `airs bench host`
//! reports it, and `scripts/peer-bench.sh` runs it around every engine's run.
//!
//! The two placements differ in a third way, which a batched step feels: how long a cache line
//! written by one thread takes to reach the other ([`probe_round_trip`]). Two threads passing
//! a line back and forth took 60-90 ns a round trip whenever two threads read about 1.1× one
//! thread (cores of one chiplet, which share its L3), 330-360 ns whenever they read about 2×
//! (two chiplets: the line crosses the I/O die), and 27-35 ns in the rare one-core placement.
//! Every pool job hands its work and its results across that gap (a product's output rows
//! written by one thread are the next product's input on the other), so sixteen sequences'
//! compute-bound steps ran 461-464 tokens/s across chiplets and 537-543 on one
//! (BENCHMARKS.md).
//!
//! What: [`crate::dot_peak`]'s int8 dot probe and [`crate::bandwidth`]'s read probe, each on a
//! one-thread pool (the calling thread; the pool's workers are asleep by then, after their
//! short spin) and on the pool; then the round trip between the pool's first two threads.
//! Cost: each probe twice, so about `2 × (passes + 1) × pass_ms` of dot passes and `2 ×
//! passes` reads of `read_bytes` after its first touch, and [`ROUND_TRIPS`] round trips
//! (under 10 ms): ≈ 0.5 s with the defaults of `airs bench host`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use airs_kernels::Isa;

use crate::bandwidth::probe_read_bandwidth;
use crate::dot_peak::probe_int8_dot_peak;
use crate::pool::ThreadPool;

/// One probe's figures on one thread and on all the pool's threads.
#[derive(Clone, Debug, PartialEq)]
pub struct CoreShare {
    pub threads: usize,
    /// Int8 multiply-accumulates per second, median over passes: one thread, all threads.
    pub dot_one_macs_per_s: f64,
    pub dot_all_macs_per_s: f64,
    /// Bytes read per second, median over passes: one thread, all threads.
    pub read_one_bytes_per_s: f64,
    pub read_all_bytes_per_s: f64,
    /// Nanoseconds for a cache line to go from the pool's first thread to its second and back
    /// ([`probe_round_trip`]); `None` on one thread.
    pub round_trip_ns: Option<f64>,
}

/// Whether the threads each get a resource (a core's multipliers, a path to memory) of their
/// own, share one, or something between (the host moved them while the probe ran).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// All the threads together get at least ¾ of `threads` times one thread's rate (on 2
    /// threads: ≥ 1.5×).
    Own,
    /// Under 0.65 of it (on 2 threads: < 1.3×).
    Shared,
    Between,
}

impl Sharing {
    /// The class of `ratio`, the threads' rate together over one thread's.
    pub fn of(ratio: f64, threads: usize) -> Sharing {
        let threads = threads as f64;
        if ratio >= 0.75 * threads {
            Sharing::Own
        } else if ratio < 0.65 * threads {
            Sharing::Shared
        } else {
            Sharing::Between
        }
    }

    /// The class of a run bracketed by two probes: theirs when they agree, else `Between`
    /// (the host moved the threads during the run).
    pub fn bracketing(before: Sharing, after: Sharing) -> Sharing {
        if before == after {
            before
        } else {
            Sharing::Between
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Sharing::Own => "own",
            Sharing::Shared => "shared",
            Sharing::Between => "between",
        }
    }
}

impl CoreShare {
    /// Cores' worth of the dot instruction the threads get: `threads` when each runs on a core
    /// of its own, 1 when they all share one core's multipliers.
    pub fn dot_cores(&self) -> f64 {
        self.dot_all_macs_per_s / self.dot_one_macs_per_s
    }

    /// How many times one thread's read bandwidth all the threads read together (on the host
    /// above: about 2 on two chiplets, about 1.1 on one).
    pub fn read_scaling(&self) -> f64 {
        self.read_all_bytes_per_s / self.read_one_bytes_per_s
    }

    /// Whether the threads each have a core's multipliers.
    pub fn multipliers(&self) -> Sharing {
        Sharing::of(self.dot_cores(), self.threads)
    }

    /// Whether the threads each have a path to memory (on the host above: two chiplets' links,
    /// or one).
    pub fn read_path(&self) -> Sharing {
        Sharing::of(self.read_scaling(), self.threads)
    }
}

/// Probe `pool`'s threads alone and together (`pass_ms` a dot pass, `read_bytes` a read pass,
/// `passes` each).
pub fn probe_core_share(
    pool: &ThreadPool,
    isa: Isa,
    pass_ms: u64,
    read_bytes: usize,
    passes: usize,
) -> CoreShare {
    let (dot_one, dot_all) = alone_then_together(pool, |p| {
        probe_int8_dot_peak(p, isa, pass_ms, passes).median_macs_per_s
    });
    let (read_one, read_all) = read_alone_then_together(pool, isa, read_bytes, passes);
    CoreShare {
        threads: pool.threads(),
        dot_one_macs_per_s: dot_one,
        dot_all_macs_per_s: dot_all,
        read_one_bytes_per_s: read_one,
        read_all_bytes_per_s: read_all,
        round_trip_ns: probe_round_trip(pool, ROUND_TRIPS).map(|t| t.as_secs_f64() * 1e9),
    }
}

/// Round trips [`probe_core_share`] times: about 1 ms on one chiplet, 7 ms across two.
pub const ROUND_TRIPS: usize = 20_000;

/// The mean time for a cache line written by the pool's thread 0 to be seen by its thread 1,
/// and for thread 1's answer to come back, over up to `round_trips` exchanges (the two threads
/// spin on one atomic word on its own line, each writing the next value when it reads the
/// other's; the clock starts once thread 1 has said it is running). Stops early after 100 ms
/// (threads sharing one CPU pass the line only when the scheduler switches them); `None` with
/// fewer than two threads or no round trip done.
pub fn probe_round_trip(pool: &ThreadPool, round_trips: usize) -> Option<Duration> {
    /// The word the threads pass, alone on its cache line.
    #[repr(align(64))]
    struct Line(AtomicU64);
    /// Written instead of the next value when thread 0 gives up.
    const STOP: u64 = u64::MAX;
    const BUDGET: Duration = Duration::from_millis(100);
    if pool.threads() < 2 || round_trips == 0 {
        return None;
    }
    let line = Line(AtomicU64::new(0));
    let result = std::sync::Mutex::new(None);
    pool.run(&|thread| match thread {
        0 => {
            // Thread 1 writes 1 when it runs; round trip `i` sends 2i + 2 and waits for 2i + 3.
            while line.0.load(Ordering::Acquire) != 1 {
                std::hint::spin_loop();
            }
            let started = Instant::now();
            let mut done = 0;
            while done < round_trips {
                if done % 64 == 63 && started.elapsed() > BUDGET {
                    break;
                }
                let sent = 2 * done as u64 + 2;
                line.0.store(sent, Ordering::Release);
                while line.0.load(Ordering::Acquire) != sent + 1 {
                    std::hint::spin_loop();
                }
                done += 1;
            }
            let elapsed = started.elapsed();
            line.0.store(STOP, Ordering::Release);
            *result.lock().unwrap_or_else(|e| e.into_inner()) =
                (done > 0).then(|| elapsed / done as u32);
        }
        1 => {
            line.0.store(1, Ordering::Release);
            let mut expect = 2;
            loop {
                match line.0.load(Ordering::Acquire) {
                    STOP => break,
                    v if v == expect => {
                        line.0.store(v + 1, Ordering::Release);
                        expect += 2;
                    }
                    _ => std::hint::spin_loop(),
                }
            }
        }
        _ => {}
    });
    result.into_inner().unwrap_or_else(|e| e.into_inner())
}

/// The read probes of [`probe_core_share`] alone: one thread's and all threads' read bandwidth
/// (what a memory-bound measurement needs to know, without the dot probes' time).
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct ReadPlacement {
    pub threads: usize,
    pub one_bytes_per_s: f64,
    pub all_bytes_per_s: f64,
}

impl ReadPlacement {
    /// Whether the threads each have a path to memory ([`CoreShare::read_path`]).
    pub fn read_path(&self) -> Sharing {
        Sharing::of(self.all_bytes_per_s / self.one_bytes_per_s, self.threads)
    }
}

/// Probe the read bandwidth of one of `pool`'s threads, then of all of them.
pub fn probe_read_placement(
    pool: &ThreadPool,
    isa: Isa,
    read_bytes: usize,
    passes: usize,
) -> ReadPlacement {
    let (one, all) = read_alone_then_together(pool, isa, read_bytes, passes);
    ReadPlacement {
        threads: pool.threads(),
        one_bytes_per_s: one,
        all_bytes_per_s: all,
    }
}

/// [`ReadPlacement::read_path`] of a fresh [`probe_read_placement`].
pub fn probe_read_path(pool: &ThreadPool, isa: Isa, read_bytes: usize, passes: usize) -> Sharing {
    probe_read_placement(pool, isa, read_bytes, passes).read_path()
}

fn read_alone_then_together(
    pool: &ThreadPool,
    isa: Isa,
    read_bytes: usize,
    passes: usize,
) -> (f64, f64) {
    alone_then_together(pool, |p| {
        probe_read_bandwidth(p, isa, read_bytes, passes).median_bytes_per_s
    })
}

/// `rate` measured on a one-thread pool (the calling thread), then on `pool`.
fn alone_then_together(pool: &ThreadPool, rate: impl Fn(&ThreadPool) -> f64) -> (f64, f64) {
    let one = ThreadPool::new(1);
    // The pool's workers spin 200 µs after a job before they sleep; let them sleep so that the
    // one-thread figure is one thread's.
    std::thread::sleep(std::time::Duration::from_millis(2));
    (rate(&one), rate(pool))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_one_thread_then_all_of_them() {
        let pool = ThreadPool::new(2);
        let share = probe_core_share(&pool, Isa::detect(), 5, 8 << 20, 3);
        assert_eq!(share.threads, 2);
        // The ratios are the host's (tests running beside this one move them); each figure is
        // a real rate.
        for rate in [
            share.dot_one_macs_per_s,
            share.dot_all_macs_per_s,
            share.read_one_bytes_per_s,
            share.read_all_bytes_per_s,
        ] {
            assert!(rate.is_finite() && rate > 0.0, "{share:?}");
        }
        assert!(share.dot_cores().is_finite() && share.read_scaling().is_finite());
        let round_trip = share.round_trip_ns.expect("two threads");
        assert!(round_trip.is_finite() && round_trip > 0.0, "{share:?}");
    }

    #[test]
    fn a_cache_line_goes_to_the_second_thread_and_back() {
        let pool = ThreadPool::new(2);
        // Whatever the placement (a test beside this one may share its CPUs: the budget bounds
        // it), each exchange takes a real, finite time, and the pool still runs jobs after.
        let t = probe_round_trip(&pool, 2_000).expect("two threads");
        assert!(
            t > Duration::ZERO && t < Duration::from_millis(100),
            "{t:?}"
        );
        assert_eq!(probe_round_trip(&ThreadPool::new(1), 2_000), None);
        assert_eq!(probe_round_trip(&pool, 0), None);
        let ran = AtomicU64::new(0);
        pool.run(&|_| {
            ran.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(ran.into_inner(), 2);
    }

    #[test]
    fn two_threads_own_a_resource_from_one_and_a_half_times_one_thread() {
        let class = |ratio| Sharing::of(ratio, 2);
        assert_eq!(
            [2.0, 1.5, 1.49, 1.3, 1.29, 1.1].map(class),
            [
                Sharing::Own,
                Sharing::Own,
                Sharing::Between,
                Sharing::Between,
                Sharing::Shared,
                Sharing::Shared
            ]
        );
        // One thread always has its own; four share from under 2.6×.
        assert_eq!(Sharing::of(1.0, 1), Sharing::Own);
        assert_eq!(Sharing::of(2.5, 4), Sharing::Shared);
        assert_eq!(Sharing::of(3.0, 4), Sharing::Own);
        // A run between two probes is theirs only when they agree.
        assert_eq!(
            Sharing::bracketing(Sharing::Own, Sharing::Own),
            Sharing::Own
        );
        assert_eq!(
            Sharing::bracketing(Sharing::Own, Sharing::Shared),
            Sharing::Between
        );
    }
}
