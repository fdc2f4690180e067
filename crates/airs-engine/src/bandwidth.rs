//! The memory read-bandwidth probe: how many bytes per second this machine streams from DRAM
//! into the pool's threads right now, so `airs bench decode` can say what fraction of it
//! decode achieves on weights (issue 13 asks for ≥ 90 %). Shared machines drift by 2× over a
//! day (on the benchmark host, as the host moves its vCPUs onto one chiplet's memory link or
//! two: [`crate::cores`]); a figure is only comparable with one measured in the same run by the
//! same threads.
//!
//! What: a buffer far larger than the last-level cache, on huge pages where the host gives them
//! (as the weight regions are), split into one contiguous part per thread and first touched by
//! that thread (so its pages sit where that thread reads them);
//! then `passes` timed passes, each one pool job in which every thread streams its part with
//! [`airs_kernels::xor_fold`] (full-width loads, no stores). Reported: the median and the best
//! pass. Cost: `buffer_bytes` of anonymous memory for the probe's duration (a bench-only
//! allocation, outside the model pool), its first touch, and `passes × buffer_bytes /
//! bandwidth` of time (256 MiB × 5 passes at 25 GB/s: ≈ 55 ms).

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use airs_kernels::Isa;
use airs_memory::HugePageBuffer;

use crate::par::DisjointOut;
use crate::pool::ThreadPool;

/// What one probe measured.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadBandwidth {
    /// Median over passes of bytes read per second by all threads together.
    pub median_bytes_per_s: f64,
    /// The fastest pass.
    pub best_bytes_per_s: f64,
    pub buffer_bytes: usize,
    pub passes: usize,
    pub threads: usize,
}

/// A read probe's buffer, touched and ready: [`ReadProbe::pass`] streams it once with every
/// thread of the pool it was made for. [`probe_read_bandwidth`] makes one for a few passes;
/// `airs bench decode --probe-steps` keeps one and runs a pass between every two decode steps,
/// so each step is compared with what the memory gave a moment before and after it.
pub struct ReadProbe {
    buffer: HugePageBuffer,
    part_bytes: usize,
    threads: usize,
    isa: Isa,
}

impl ReadProbe {
    /// A buffer of about `buffer_bytes` (at least 4 KiB a thread, whole cache lines), one
    /// contiguous part per thread of `pool`, first touched by the thread that will read it.
    pub fn new(pool: &ThreadPool, isa: Isa, buffer_bytes: usize) -> ReadProbe {
        let threads = pool.threads();
        let part_bytes = (buffer_bytes / threads).max(4096) / 64 * 64;
        let total = part_bytes * threads;
        // On huge pages where the host gives them, as the weights are: on base pages one thread
        // read 14-35 % less here (module docs of `airs_memory::HugePageBuffer`).
        let mut buffer = HugePageBuffer::new(total)
            .unwrap_or_else(|e| panic!("the read probe's {total}-byte buffer: {e}"));
        {
            let writer = DisjointOut::new(buffer.as_mut_slice());
            pool.run(&|t| {
                // SAFETY: thread t writes only its own part [t·part, (t+1)·part).
                let part = unsafe { writer.slice(t * part_bytes..(t + 1) * part_bytes) };
                for (i, b) in part.iter_mut().enumerate() {
                    *b = (i as u8) ^ (t as u8);
                }
            });
        }
        ReadProbe {
            buffer,
            part_bytes,
            threads,
            isa,
        }
    }

    /// Bytes one pass reads.
    pub fn buffer_bytes(&self) -> usize {
        self.part_bytes * self.threads
    }

    /// `passes` (at least one) timed passes on `pool` (the pool it was made for).
    fn passes(&self, pool: &ThreadPool, passes: usize) -> PassRates {
        assert_eq!(
            pool.threads(),
            self.threads,
            "a read probe runs on its own pool"
        );
        let buffer = self.buffer.as_slice();
        let sink = AtomicU64::new(0);
        let rates = timed_passes(pool, passes, self.buffer_bytes() as f64, &|t| {
            let part = &buffer[t * self.part_bytes..(t + 1) * self.part_bytes];
            sink.fetch_xor(airs_kernels::xor_fold(self.isa, part), Ordering::Relaxed);
        });
        black_box(sink.load(Ordering::Relaxed));
        rates
    }

    /// One timed pass: bytes read per second by all threads together.
    pub fn pass(&self, pool: &ThreadPool) -> f64 {
        self.passes(pool, 1).median
    }
}

/// Stream a `buffer_bytes` buffer `passes` times with every thread of `pool` (each its own
/// part) and report the read bandwidth.
pub fn probe_read_bandwidth(
    pool: &ThreadPool,
    isa: Isa,
    buffer_bytes: usize,
    passes: usize,
) -> ReadBandwidth {
    let probe = ReadProbe::new(pool, isa, buffer_bytes);
    let rates = probe.passes(pool, passes);
    ReadBandwidth {
        median_bytes_per_s: rates.median,
        best_bytes_per_s: rates.best,
        buffer_bytes: probe.buffer_bytes(),
        passes: rates.passes,
        threads: probe.threads,
    }
}

/// The rates of [`timed_passes`]: per second, over passes.
pub(crate) struct PassRates {
    pub(crate) median: f64,
    pub(crate) best: f64,
    pub(crate) passes: usize,
}

/// `passes` (at least one) timed pool jobs of `work(thread)`, each doing `work_per_pass` units
/// of work in all: the median and best rate in units per second. The probes of this crate
/// (read bandwidth, the int8 dot peak) share it.
pub(crate) fn timed_passes(
    pool: &ThreadPool,
    passes: usize,
    work_per_pass: f64,
    work: &(dyn Fn(usize) + Sync),
) -> PassRates {
    let mut rates: Vec<f64> = (0..passes.max(1))
        .map(|_| {
            let started = Instant::now();
            pool.run(work);
            work_per_pass / started.elapsed().as_secs_f64().max(1e-9)
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    let n = rates.len();
    let median = if n % 2 == 1 {
        rates[n / 2]
    } else {
        (rates[n / 2 - 1] + rates[n / 2]) / 2.0
    };
    PassRates {
        median,
        best: rates[n - 1],
        passes: n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_reads_the_whole_buffer_with_every_thread() {
        let pool = ThreadPool::new(2);
        let probe = probe_read_bandwidth(&pool, Isa::detect(), 1 << 20, 3);
        assert_eq!(probe.threads, 2);
        assert_eq!(probe.passes, 3);
        assert_eq!(probe.buffer_bytes, 1 << 20);
        assert!(
            probe.median_bytes_per_s > 0.0 && probe.best_bytes_per_s >= probe.median_bytes_per_s
        );
    }

    #[test]
    fn a_kept_probe_reads_its_buffer_once_a_pass() {
        let pool = ThreadPool::new(2);
        let probe = ReadProbe::new(&pool, Isa::detect(), (1 << 20) + 100);
        // Whole cache lines a thread: the odd 100 bytes are left out.
        assert_eq!(probe.buffer_bytes(), 1 << 20);
        for _ in 0..3 {
            let rate = probe.pass(&pool);
            assert!(rate.is_finite() && rate > 0.0);
        }
    }
}
