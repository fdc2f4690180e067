//! What a draft token costs and what it is worth: how many drafts ([`crate::lookup`]) each
//! decoding sequence computes in a step.
//!
//! A draft pays when the time its row adds to the step buys more tokens than that time buys
//! on average. Both sides are measured while serving:
//! - **cost**: the scheduler times its steps and fits `step seconds = fixed + per_row × rows`
//!   by least squares with exponential forgetting ([`StepTimeFit`], half-life
//!   [`StepTimeFit::HALF_LIFE_STEPS`] steps), over steps of at most [`StepTimeFit::MAX_ROWS`]
//!   rows (the regime drafts live in; a long prompt's chunk weighs attention differently).
//!   Where the weights are streamed from DRAM (Qwen2.5-0.5B, 2 threads) the fixed part is
//!   most of a step and a row costs a few per cent of it; where they fit in cache
//!   (stories260K) a row is most of a step, and drafts pay only when nearly all are kept;
//! - **worth**: a sequence's rate of agreement ([`Acceptance`]): of the drafts it put to the
//!   model (those whose predecessor was kept), the fraction the model drew. Draft `j` of a
//!   sequence with rate `p` is kept with probability `p^j` (each kept only if all before it
//!   were). A sequence starts from the scheduler's overall rate, weighted as
//!   [`Acceptance::PRIOR_DRAFTS`] drafts.
//!
//! The choice ([`choose`]) is greedy: the draft with the most expected tokens next (the
//! sequences' next `p^j`) joins the step while it raises the step's expected tokens per second
//! — `p^j / per_row > tokens / seconds` — and the limits allow. Greedy is optimal here: each
//! sequence's gains decrease, and a draft that joins raises the bar the next must clear.
//! Until the fit has seen [`StepTimeFit::MIN_STEPS`] steps of different sizes (a fresh
//! scheduler), rows count as free
//! and every draft the limits allow is computed, which is also how the fit gets its spread; a
//! scheduler that has drafted nothing for [`EXPLORE_EVERY_STEPS`] steps while it had proposals
//! computes one draft, so that the fit keeps measuring what a row costs.
//!
//! Cost: O(1) per step for the fit; `choose` is O(drafts × sequences) (16 × 16 at most).

/// What a step costs in time, as [`StepTimeFit`] estimates it.
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize)]
pub struct StepCost {
    pub fixed_seconds: f64,
    pub row_seconds: f64,
}

impl StepCost {
    /// Rows cost nothing: every draft the limits allow is computed.
    pub const FREE: StepCost = StepCost {
        fixed_seconds: 1.0,
        row_seconds: 0.0,
    };

    pub fn seconds(&self, rows: usize) -> f64 {
        self.fixed_seconds + self.row_seconds * rows as f64
    }
}

/// Least-squares fit of step time against rows, forgetting old steps (see the module
/// documentation).
#[derive(Clone, Debug, Default)]
pub struct StepTimeFit {
    weight: f64,
    rows: f64,
    seconds: f64,
    rows_squared: f64,
    rows_seconds: f64,
}

impl StepTimeFit {
    /// Steps after which a step's weight in the fit has halved.
    pub const HALF_LIFE_STEPS: f64 = 64.0;
    /// Steps with more rows are not observed.
    pub const MAX_ROWS: usize = 64;

    /// Record a step of `rows` rows that took `seconds`.
    pub fn observe(&mut self, rows: usize, seconds: f64) {
        if rows == 0 || rows > Self::MAX_ROWS || !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        let keep = 0.5f64.powf(1.0 / Self::HALF_LIFE_STEPS);
        let x = rows as f64;
        self.weight = self.weight * keep + 1.0;
        self.rows = self.rows * keep + x;
        self.seconds = self.seconds * keep + seconds;
        self.rows_squared = self.rows_squared * keep + x * x;
        self.rows_seconds = self.rows_seconds * keep + x * seconds;
    }

    /// Steps observed before the fit is trusted.
    pub const MIN_STEPS: f64 = 8.0;

    /// The fitted cost, or `None` before [`Self::MIN_STEPS`] steps or while the steps observed
    /// (by weight) hardly differ in rows: their rows' weighted variance is below 1/16 (a step
    /// in 16 one row off the others).
    pub fn estimate(&self) -> Option<StepCost> {
        if self.weight < Self::MIN_STEPS - 1e-9 {
            return None;
        }
        let mean_rows = self.rows / self.weight;
        let mean_seconds = self.seconds / self.weight;
        let variance = self.rows_squared / self.weight - mean_rows * mean_rows;
        if variance < 1.0 / 16.0 {
            return None;
        }
        let covariance = self.rows_seconds / self.weight - mean_rows * mean_seconds;
        let row_seconds = (covariance / variance).max(0.0);
        let fixed_seconds = (mean_seconds - row_seconds * mean_rows).max(0.0);
        Some(StepCost {
            fixed_seconds,
            row_seconds,
        })
    }
}

/// A sequence's (or a scheduler's) drafts put to the model and agreed with.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct Acceptance {
    pub tried: f64,
    pub agreed: f64,
}

impl Acceptance {
    /// How many drafts' worth of weight a sequence's prior (the scheduler's rate) has.
    pub const PRIOR_DRAFTS: f64 = 4.0;
    /// A scheduler that has verified nothing yet expects half its drafts kept.
    pub const INITIAL: Acceptance = Acceptance {
        tried: 2.0,
        agreed: 1.0,
    };
    /// The scheduler's overall rate forgets this share of itself at each verification, so
    /// that it follows a change of workload.
    const OVERALL_KEEP: f64 = 0.99;

    /// Record one verification: `tried` drafts put to the model, `agreed` of them drawn.
    pub fn record(&mut self, tried: usize, agreed: usize) {
        self.tried += tried as f64;
        self.agreed += agreed as f64;
    }

    /// Record one verification into a scheduler's overall rate (forgetting old ones).
    pub fn record_overall(&mut self, tried: usize, agreed: usize) {
        self.tried = self.tried * Self::OVERALL_KEEP + tried as f64;
        self.agreed = self.agreed * Self::OVERALL_KEEP + agreed as f64;
    }

    /// The plain rate (0.5 before anything was tried).
    pub fn rate(&self) -> f64 {
        if self.tried <= 0.0 {
            0.5
        } else {
            self.agreed / self.tried
        }
    }

    /// This sequence's rate, starting from `prior` weighted as [`Self::PRIOR_DRAFTS`] drafts;
    /// within [0.02, 0.98], so that no draft is certain and none worthless.
    pub fn rate_with_prior(&self, prior: f64) -> f64 {
        let rate = (self.agreed + Self::PRIOR_DRAFTS * prior) / (self.tried + Self::PRIOR_DRAFTS);
        rate.clamp(0.02, 0.98)
    }
}

/// After this many steps in a row that had proposals and drafted nothing, a step drafts one
/// token (see the module documentation).
pub const EXPLORE_EVERY_STEPS: u32 = 16;

/// One decoding sequence that has drafts to offer.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Candidate {
    /// Its rate of agreement ([`Acceptance::rate_with_prior`]).
    pub rate: f64,
    /// Most drafts it may compute (its proposal's length within its limits).
    pub max_drafts: usize,
}

/// How many drafts each candidate computes this step (see the module documentation): the
/// step has `rows` rows and expects `tokens` tokens without drafts, and takes at most
/// `max_drafts` more rows. With [`StepCost::FREE`], candidates take all they may, in order.
pub fn choose(
    cost: StepCost,
    rows: usize,
    tokens: f64,
    candidates: &[Candidate],
    max_drafts: usize,
) -> Vec<usize> {
    let mut counts = vec![0usize; candidates.len()];
    let mut left = max_drafts;
    if cost.row_seconds <= 0.0 {
        for (count, c) in counts.iter_mut().zip(candidates) {
            *count = c.max_drafts.min(left);
            left -= *count;
        }
        return counts;
    }
    let mut seconds = cost.seconds(rows);
    let mut tokens = tokens;
    // Each candidate's next draft's expected tokens: rate^(count + 1).
    let mut gains: Vec<f64> = candidates.iter().map(|c| c.rate).collect();
    while left > 0 {
        let best = (0..candidates.len())
            .filter(|&i| counts[i] < candidates[i].max_drafts)
            .max_by(|&a, &b| gains[a].total_cmp(&gains[b]));
        let Some(i) = best else { break };
        // Joins while it raises tokens per second: gain / row > tokens / seconds.
        if gains[i] * seconds <= cost.row_seconds * tokens {
            break;
        }
        counts[i] += 1;
        tokens += gains[i];
        seconds += cost.row_seconds;
        gains[i] *= candidates[i].rate;
        left -= 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(fixed_ms: f64, row_ms: f64) -> StepCost {
        StepCost {
            fixed_seconds: fixed_ms / 1e3,
            row_seconds: row_ms / 1e3,
        }
    }

    fn candidate(rate: f64, max_drafts: usize) -> Candidate {
        Candidate { rate, max_drafts }
    }

    #[test]
    fn the_fit_recovers_a_step_time_line() {
        let mut fit = StepTimeFit::default();
        assert_eq!(fit.estimate(), None);
        let line = |rows: usize| 0.008 + 0.0015 * rows as f64;
        for i in 0..7 {
            fit.observe(1 + i % 2, line(1 + i % 2));
        }
        assert_eq!(fit.estimate(), None, "seven steps");
        for i in 0..200 {
            fit.observe(1 + i % 9, line(1 + i % 9));
        }
        let c = fit.estimate().expect("rows varied");
        assert!((c.fixed_seconds - 0.008).abs() < 1e-9, "{c:?}");
        assert!((c.row_seconds - 0.0015).abs() < 1e-9, "{c:?}");
    }

    #[test]
    fn the_fit_needs_steps_of_different_sizes() {
        let mut fit = StepTimeFit::default();
        for _ in 0..100 {
            fit.observe(4, 0.01);
        }
        assert_eq!(fit.estimate(), None);
        // Steps past MAX_ROWS (a prompt's chunk) are not observed.
        fit.observe(512, 1.0);
        assert_eq!(fit.estimate(), None);
        fit.observe(5, 0.011);
        fit.observe(3, 0.009);
        assert_eq!(fit.estimate(), None, "two steps off among a hundred");
        for _ in 0..20 {
            fit.observe(5, 0.011);
            fit.observe(3, 0.009);
        }
        let c = fit.estimate().expect("rows varied");
        assert!((c.row_seconds - 0.001).abs() < 1e-6, "{c:?}");
    }

    #[test]
    fn the_fit_forgets_old_steps() {
        let mut fit = StepTimeFit::default();
        for i in 0..100 {
            fit.observe(1 + i % 2, 0.010 * (1 + i % 2) as f64);
        }
        // The host slows down: rows cost twice as much now.
        for i in 0..1000 {
            fit.observe(1 + i % 2, 0.020 * (1 + i % 2) as f64);
        }
        let c = fit.estimate().expect("rows varied");
        assert!((c.row_seconds - 0.020).abs() < 1e-4, "{c:?}");
    }

    #[test]
    fn a_row_that_costs_little_takes_every_likely_draft() {
        // Weights streamed: 8 ms a step, 0.3 ms a row; one sequence copying (p = 0.9).
        let counts = choose(cost(8.0, 0.3), 1, 1.0, &[candidate(0.9, 8)], 8);
        assert_eq!(counts, [8]);
        // An open answer (p = 0.3): the first drafts still pay, p^j falls fast.
        let counts = choose(cost(8.0, 0.3), 1, 1.0, &[candidate(0.3, 8)], 8);
        assert!((1..=3).contains(&counts[0]), "{counts:?}");
    }

    #[test]
    fn a_row_that_costs_a_step_takes_only_near_certain_drafts() {
        // Weights in cache: a row is most of a step.
        assert_eq!(
            choose(cost(0.01, 0.06), 1, 1.0, &[candidate(0.5, 8)], 8),
            [0]
        );
        let counts = choose(cost(0.01, 0.06), 1, 1.0, &[candidate(0.98, 8)], 8);
        assert!(counts[0] >= 1, "{counts:?}");
    }

    #[test]
    fn the_likeliest_drafts_win_between_sequences() {
        // Four decode rows: 10 ms + 1 ms a row. The copying sequence drafts, the others less
        // or not at all.
        let candidates = [candidate(0.2, 8), candidate(0.95, 8), candidate(0.5, 8)];
        let counts = choose(cost(10.0, 1.0), 4, 4.0, &candidates, 12);
        assert!(counts[1] >= 4, "{counts:?}");
        assert!(
            counts[1] > counts[2] && counts[2] >= counts[0],
            "{counts:?}"
        );
        // The step's room caps the total.
        let counts = choose(cost(10.0, 1.0), 4, 4.0, &candidates, 3);
        assert_eq!(counts.iter().sum::<usize>(), 3);
        assert_eq!(counts[1], 3);
    }

    #[test]
    fn free_rows_fill_the_room_in_order() {
        let candidates = [candidate(0.1, 5), candidate(0.9, 8), candidate(0.5, 8)];
        assert_eq!(choose(StepCost::FREE, 3, 3.0, &candidates, 9), [5, 4, 0]);
        assert_eq!(choose(StepCost::FREE, 3, 3.0, &candidates, 0), [0, 0, 0]);
    }

    #[test]
    fn every_draft_chosen_raises_expected_throughput() {
        // Exhaustively over a grid: the choice's tokens per second are at least those of no
        // drafts and of one draft fewer or more for any candidate.
        let rates = [0.05, 0.3, 0.6, 0.9, 0.98];
        for fixed in [0.05, 1.0, 8.0] {
            for row in [0.01, 0.3, 2.0] {
                for &a in &rates {
                    for &b in &rates {
                        let cs = [candidate(a, 8), candidate(b, 8)];
                        let counts = choose(cost(fixed, row), 2, 2.0, &cs, 16);
                        let rate = |counts: &[usize]| {
                            let tokens: f64 = 2.0
                                + cs.iter()
                                    .zip(counts)
                                    .map(|(c, &k)| {
                                        (1..=k).map(|j| c.rate.powi(j as i32)).sum::<f64>()
                                    })
                                    .sum::<f64>();
                            let drafts: usize = counts.iter().sum();
                            tokens / cost(fixed, row).seconds(2 + drafts)
                        };
                        let chosen = rate(&counts);
                        assert!(chosen >= rate(&[0, 0]) - 1e-12);
                        for i in 0..2 {
                            for delta in [-1i64, 1] {
                                let mut other = counts.clone();
                                let k = other[i] as i64 + delta;
                                if !(0..=8).contains(&k) {
                                    continue;
                                }
                                other[i] = k as usize;
                                assert!(
                                    chosen >= rate(&other) - 1e-12,
                                    "{fixed} {row} {a} {b}: {counts:?} vs {other:?}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_sequence_starts_from_the_overall_rate() {
        let seq = Acceptance::default();
        assert!((seq.rate_with_prior(0.8) - 0.8).abs() < 1e-12);
        let mut seq = Acceptance::default();
        seq.record(8, 0);
        seq.record(1, 0);
        // Nine misses against four drafts' worth of 0.8: 3.2 / 13.
        assert!((seq.rate_with_prior(0.8) - 3.2 / 13.0).abs() < 1e-12);
        let mut overall = Acceptance::INITIAL;
        for _ in 0..2000 {
            overall.record_overall(4, 4);
        }
        assert!(overall.rate() > 0.999);
    }
}
