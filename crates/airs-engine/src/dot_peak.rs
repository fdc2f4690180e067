//! The int8 dot-product peak probe: how many int8 multiply-accumulates per second the pool's
//! threads sustain right now with the instruction the matrix kernels use, so `airs bench
//! batch` can say what fraction of the machine's arithmetic a batched step reaches (batched
//! decode of many sequences is bound by it, as single-sequence decode is bound by the read
//! bandwidth that [`crate::bandwidth`] probes). A shared machine's neighbours take cores and
//! clocks: a figure is only comparable with one measured in the same run by the same threads.
//!
//! What: one short calibration call sizes a pass to about `pass_ms`; then `passes` timed
//! passes, each one pool job in which every thread runs [`airs_kernels::peak::int8_dot_rounds`]
//! (independent chains of the dot instruction, no memory traffic). Reported: the median and
//! the best pass. Cost: `(passes + 1) × pass_ms` of every thread's time.

use std::hint::black_box;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use airs_kernels::Isa;
use airs_kernels::peak::{MACS_PER_ROUND, int8_dot_rounds};

use crate::bandwidth::timed_passes;
use crate::pool::ThreadPool;

/// What one probe measured.
#[derive(Clone, Debug, PartialEq)]
pub struct DotPeak {
    /// Median over passes of int8 multiply-accumulates per second by all threads together.
    pub median_macs_per_s: f64,
    /// The fastest pass.
    pub best_macs_per_s: f64,
    pub passes: usize,
    pub threads: usize,
}

/// Run `passes` passes of about `pass_ms` milliseconds on every thread of `pool` and report
/// the int8 dot-product rate.
pub fn probe_int8_dot_peak(pool: &ThreadPool, isa: Isa, pass_ms: u64, passes: usize) -> DotPeak {
    let threads = pool.threads();
    let sink = AtomicI64::new(0);
    // Calibrate on one thread: rounds per millisecond.
    let calibration_rounds = 20_000;
    let started = Instant::now();
    sink.fetch_xor(int8_dot_rounds(isa, calibration_rounds), Ordering::Relaxed);
    let per_ms = calibration_rounds as f64 / (started.elapsed().as_secs_f64() * 1e3).max(1e-6);
    let rounds = ((per_ms * pass_ms as f64) as u64).max(1);
    let macs = (rounds * MACS_PER_ROUND) as f64 * threads as f64;
    let rates = timed_passes(pool, passes, macs, &|_| {
        sink.fetch_xor(int8_dot_rounds(isa, rounds), Ordering::Relaxed);
    });
    black_box(sink.load(Ordering::Relaxed));
    DotPeak {
        median_macs_per_s: rates.median,
        best_macs_per_s: rates.best,
        passes: rates.passes,
        threads,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_runs_every_pass_on_every_thread() {
        let pool = ThreadPool::new(2);
        let peak = probe_int8_dot_peak(&pool, Isa::detect(), 2, 3);
        assert_eq!((peak.threads, peak.passes), (2, 3));
        assert!(peak.median_macs_per_s > 0.0 && peak.best_macs_per_s >= peak.median_macs_per_s);
    }
}
