//! The counters and latency histograms a scheduler keeps for `/metrics` and the benchmarks:
//! cumulative Prometheus-style histograms (fixed upper bounds, a count per bucket, a sum), and
//! per-priority counters.
//!
//! Cost: an observation is a scan of at most [`LATENCY_BUCKETS`] bounds; no allocation.

use serde::Serialize;

use airs_memory::eviction::Priority;

/// Upper bounds in seconds of the latency buckets (time to first token, inter-token latency):
/// 1 ms to 60 s, roughly ×2.5 apart, as vLLM's.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0,
];

/// A latency histogram over [`LATENCY_BUCKETS`] (plus the implicit `+Inf` bucket).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Histogram {
    /// Observations at or below each bound (not cumulative; `counts[16]` is above the last).
    pub counts: [u64; 17],
    pub sum_seconds: f64,
    pub count: u64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram {
            counts: [0; 17],
            sum_seconds: 0.0,
            count: 0,
        }
    }
}

impl Histogram {
    pub fn observe(&mut self, seconds: f64) {
        let i = LATENCY_BUCKETS
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.counts[i] += 1;
        self.sum_seconds += seconds;
        self.count += 1;
    }

    /// `(upper bound, cumulative count)` pairs, the last one `+Inf` (as Prometheus wants).
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut total = 0;
        let mut out = Vec::with_capacity(self.counts.len());
        for (i, &c) in self.counts.iter().enumerate() {
            total += c;
            out.push((
                LATENCY_BUCKETS.get(i).copied().unwrap_or(f64::INFINITY),
                total,
            ));
        }
        out
    }
}

/// One counter per priority.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PerPriority {
    pub interactive: u64,
    pub system: u64,
    pub background: u64,
}

impl PerPriority {
    pub fn get(&self, p: Priority) -> u64 {
        match p {
            Priority::Interactive => self.interactive,
            Priority::System => self.system,
            Priority::Background => self.background,
        }
    }

    pub fn add(&mut self, p: Priority, n: u64) {
        match p {
            Priority::Interactive => self.interactive += n,
            Priority::System => self.system += n,
            Priority::Background => self.background += n,
        }
    }

    pub fn total(&self) -> u64 {
        self.interactive + self.system + self.background
    }
}

/// What a scheduler has done since it started.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SchedulerStats {
    /// Requests accepted into the queue.
    pub requests: u64,
    pub completed: u64,
    /// Requests that ended with an error after they were accepted.
    pub failed: u64,
    pub cancelled: u64,
    /// Requests refused at submission (bad request, queue full, too large for the pool).
    pub rejected: u64,
    /// Prompt tokens of admitted requests (first admission).
    pub prompt_tokens: u64,
    /// Prompt positions computed (first admission; rebuilds are `rebuilt_tokens`).
    pub prefill_tokens: u64,
    /// Positions recomputed after their KV was evicted or preempted.
    pub rebuilt_tokens: u64,
    pub generated_tokens: u64,
    /// Draws of constrained requests (`response_format`) that broke the constraint and were
    /// drawn again from the allowed tokens (each a mask over the vocabulary).
    pub constrained_redraws: u64,
    /// Draft tokens computed by speculative decoding ([`crate::lookup`]), and those kept
    /// (each one a token generated without a step of its own).
    pub draft_tokens: u64,
    pub drafts_accepted: u64,
    /// Prompt tokens looked up in the prefix cache, and those found there.
    pub prefix_queried_tokens: u64,
    pub prefix_hit_tokens: u64,
    /// Running sequences preempted (their KV freed, to be recomputed), by their priority.
    pub preemptions: PerPriority,
    /// Session caches evicted between turns (eviction steps), by the session's priority.
    pub evictions: PerPriority,
    /// Requests failed because the pool could not hold them.
    pub exhausted: u64,
    /// Forward steps run, and the rows they computed.
    pub steps: u64,
    pub rows: u64,
    /// Most sequences in one step.
    pub peak_batch: u64,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
}
