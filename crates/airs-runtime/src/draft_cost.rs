//! What a draft token costs and what it is worth: how many drafts ([`crate::lookup`]) each
//! decoding sequence computes in a step.
//!
//! A draft pays when the time its row adds to the step buys more tokens than that time buys
//! on average. Both sides are measured while serving:
//! - **cost**: the scheduler times its steps and fits `step seconds = fixed + per_row × rows`
//!   by least squares with exponential forgetting ([`StepTimeFit`], half-life
//!   [`StepTimeFit::HALF_LIFE_STEPS`] steps), over steps of decode rows and drafts only (a
//!   prompt's rows take other kernels and attend over fewer positions) of at most
//!   [`StepTimeFit::MAX_ROWS`] rows.
//!   Where the weights are streamed from DRAM (Qwen2.5-0.5B alone, 2 threads: fitted
//!   7-11 ms and 1.0-1.7 ms a row) a few rows more cost little; where they fit in cache
//!   (stories260K near the end of its 512-position context: 60-80 µs and 50-135 µs a row,
//!   attention most of it) or the step already has several sequences' rows, a draft pays only
//!   when it is likely kept. The fit keeps, beside the line, the recent mean of each row count
//!   it sees often enough, which is what it uses for that count;
//! - **worth**: a sequence's rates of agreement ([`Acceptance`]): of the first drafts of its
//!   steps, the fraction the model drew, and the same of the drafts that followed a kept one
//!   (prompt lookup drafts in runs: a copied span is drafted right to its end). Draft `j` of a
//!   step is kept with probability `first × later^(j-1)`. A sequence starts from the
//!   scheduler's overall rates, weighted as [`Acceptance::PRIOR_DRAFTS`] drafts.
//!
//! The choice ([`choose`]): the drafts are ranked by expected tokens (each sequence's next
//! probability above; they fall along a sequence, so the `K` best are every sequence's first
//! ones), and the step takes the `K` best for the `K` — within the limits — that gives the most
//! expected tokens per second, `(tokens + their gains) / seconds(rows + K)`, where `seconds`
//! is the fit (the line or a row count's mean). With a line, that is the greedy rule "a draft
//! joins while `gain / per_row > tokens / seconds`", and no draft more or fewer does better
//! (tested); with a row count's mean it also finds a step of a few rows more that costs little
//! while the weights stream.
//!
//! Until the fit has seen about [`StepTimeFit::MIN_STEPS`] steps of different sizes (a fresh
//! scheduler), rows count as free and every draft the limits allow is computed, which is also
//! how the fit gets its spread. A step that would draft nothing while it has proposals drafts
//! one token when a step of one row more has not been seen often enough to stand for itself
//! ([`StepTimeFit::knows`]), and after [`EXPLORE_EVERY_STEPS`] such steps in a row: the fit
//! keeps measuring what a row more costs where the decision is made.
//!
//! Cost: O(1) per step for the fit; `choose` is O(drafts × sequences) (16 × 16 at most).

/// What a step costs in time, as [`StepTimeFit`] estimates it.
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize)]
pub struct StepCost {
    pub fixed_seconds: f64,
    pub row_seconds: f64,
}

impl StepCost {
    pub fn seconds(&self, rows: usize) -> f64 {
        self.fixed_seconds + self.row_seconds * rows as f64
    }
}

/// Step time against rows (see the module documentation): a least-squares line over recent
/// steps, and the recent mean of each row count seen often enough, which the line is only the
/// stand-in for (a step's time is not a line: while the weights stream from DRAM a few rows
/// more cost less than the line says, past the row kernels more).
#[derive(Clone, Debug)]
pub struct StepTimeFit {
    weight: f64,
    rows: f64,
    seconds: f64,
    rows_squared: f64,
    rows_seconds: f64,
    /// Per row count (index: rows): (weight, mean seconds), each observation weighing
    /// [`Self::BIN_KEEP`] of the one before.
    bins: Vec<(f64, f64)>,
}

impl Default for StepTimeFit {
    fn default() -> StepTimeFit {
        StepTimeFit {
            weight: 0.0,
            rows: 0.0,
            seconds: 0.0,
            rows_squared: 0.0,
            rows_seconds: 0.0,
            bins: vec![(0.0, 0.0); Self::MAX_ROWS + 1],
        }
    }
}

impl StepTimeFit {
    /// Steps after which a step's weight in the fit has halved.
    pub const HALF_LIFE_STEPS: f64 = 64.0;
    /// Steps with more rows are not observed.
    pub const MAX_ROWS: usize = 64;
    /// A row count's mean keeps this share of its weight at each of its steps (about the last
    /// ten count), and stands for its steps once it weighs [`Self::BIN_MIN_WEIGHT`].
    const BIN_KEEP: f64 = 0.9;
    const BIN_MIN_WEIGHT: f64 = 2.5;

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
        let (weight, mean) = &mut self.bins[rows];
        *weight = *weight * Self::BIN_KEEP + 1.0;
        *mean += (seconds - *mean) / *weight;
    }

    /// Whether steps of `rows` rows were seen often enough to stand for themselves.
    pub fn knows(&self, rows: usize) -> bool {
        self.bins
            .get(rows)
            .is_some_and(|&(weight, _)| weight >= Self::BIN_MIN_WEIGHT)
    }

    /// What a step costs against its rows: for a row count seen often enough, the recent mean
    /// of such steps, else the line ([`Self::estimate`]); `None` while there is no line.
    pub fn curve(&self) -> Option<impl Fn(usize) -> f64 + '_> {
        let line = self.estimate()?;
        Some(move |rows: usize| {
            if self.knows(rows) {
                self.bins[rows].1
            } else {
                line.seconds(rows)
            }
        })
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

/// Drafts put to the model and those it agreed with.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct Rate {
    pub tried: f64,
    pub agreed: f64,
}

impl Rate {
    /// The rate, starting from `prior` weighted as [`Acceptance::PRIOR_DRAFTS`] drafts, within
    /// [0.02, 0.98] so that no draft is certain and none worthless.
    pub fn with_prior(&self, prior: f64) -> f64 {
        let rate = (self.agreed + Acceptance::PRIOR_DRAFTS * prior)
            / (self.tried + Acceptance::PRIOR_DRAFTS);
        rate.clamp(0.02, 0.98)
    }

    fn add(&mut self, agreed: bool, keep: f64) {
        self.tried = self.tried * keep + 1.0;
        self.agreed = self.agreed * keep + f64::from(u8::from(agreed));
    }
}

/// A sequence's (or a scheduler's) record of agreement, apart for a step's first draft and for
/// the drafts after a kept one: prompt lookup's drafts come in runs (a copied span is drafted
/// right to its end), so the draft after a kept one is kept more often than a first one.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct Acceptance {
    pub first: Rate,
    pub later: Rate,
}

impl Acceptance {
    /// How many drafts' worth of weight a sequence's prior (the scheduler's rates) has.
    pub const PRIOR_DRAFTS: f64 = 4.0;
    /// A scheduler that has verified nothing yet expects half its drafts kept.
    pub const INITIAL: Acceptance = Acceptance {
        first: Rate {
            tried: 2.0,
            agreed: 1.0,
        },
        later: Rate {
            tried: 2.0,
            agreed: 1.0,
        },
    };
    /// The scheduler's overall rates forget this share of themselves at each draft recorded,
    /// so that they follow a change of workload.
    const OVERALL_KEEP: f64 = 0.995;

    fn rate(&mut self, position: usize) -> &mut Rate {
        if position == 0 {
            &mut self.first
        } else {
            &mut self.later
        }
    }

    /// Record the draft at `position` of a step's drafts (0: the first), which the model
    /// `agreed` with or not.
    pub fn record(&mut self, position: usize, agreed: bool) {
        self.rate(position).add(agreed, 1.0);
    }

    /// The same into a scheduler's overall rates, forgetting old drafts.
    pub fn record_overall(&mut self, position: usize, agreed: bool) {
        self.rate(position).add(agreed, Self::OVERALL_KEEP);
    }

    /// This sequence's rates (first, later), each starting from the overall one.
    pub fn rates_with_prior(&self, overall: &Acceptance) -> (f64, f64) {
        let plain = |r: &Rate| r.agreed / r.tried.max(1e-9);
        (
            self.first.with_prior(plain(&overall.first)),
            self.later.with_prior(plain(&overall.later)),
        )
    }
}

/// After this many steps in a row that had proposals and drafted nothing, a step drafts one
/// token (see the module documentation).
pub const EXPLORE_EVERY_STEPS: u32 = 16;

/// One decoding sequence that has drafts to offer.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Candidate {
    /// Its rates of agreement ([`Acceptance::rates_with_prior`]): of a step's first draft, and
    /// of a draft after a kept one. Draft `j` is kept with probability `first × later^(j-1)`.
    pub first: f64,
    pub later: f64,
    /// Most drafts it may compute (its proposal's length within its limits).
    pub max_drafts: usize,
}

/// How many drafts each candidate computes this step (see the module documentation): the
/// step has `rows` rows and expects `tokens` tokens without drafts, takes at most
/// `max_drafts` more rows, and `seconds(r)` is what a step of `r` rows costs. The drafts taken
/// are the `K` likeliest (each sequence's gains fall, so they are every sequence's first ones),
/// for the `K` with the most expected tokens per second (the fewest among equals).
pub fn choose(
    seconds: impl Fn(usize) -> f64,
    rows: usize,
    tokens: f64,
    candidates: &[Candidate],
    max_drafts: usize,
) -> Vec<usize> {
    // The likeliest drafts in order: (candidate, gain).
    let mut order: Vec<(usize, f64)> = Vec::new();
    let mut counts = vec![0usize; candidates.len()];
    let mut gains: Vec<f64> = candidates.iter().map(|c| c.first).collect();
    while order.len() < max_drafts {
        let best = (0..candidates.len())
            .filter(|&i| counts[i] < candidates[i].max_drafts)
            .max_by(|&a, &b| gains[a].total_cmp(&gains[b]));
        let Some(i) = best else { break };
        order.push((i, gains[i]));
        counts[i] += 1;
        gains[i] *= candidates[i].later;
    }
    let (mut best_k, mut best_rate) = (0, tokens / seconds(rows));
    let mut expected = tokens;
    for (k, &(_, gain)) in order.iter().enumerate() {
        expected += gain;
        let rate = expected / seconds(rows + k + 1);
        if rate > best_rate {
            (best_k, best_rate) = (k + 1, rate);
        }
    }
    let mut counts = vec![0usize; candidates.len()];
    for &(i, _) in &order[..best_k] {
        counts[i] += 1;
    }
    counts
}

/// Every draft the candidates have, in order, within `max_drafts` ([`crate::DraftCost::Free`]).
pub fn fill(candidates: &[Candidate], max_drafts: usize) -> Vec<usize> {
    let mut left = max_drafts;
    candidates
        .iter()
        .map(|c| {
            let count = c.max_drafts.min(left);
            left -= count;
            count
        })
        .collect()
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

    fn line(fixed_ms: f64, row_ms: f64) -> impl Fn(usize) -> f64 {
        move |rows| cost(fixed_ms, row_ms).seconds(rows)
    }

    fn candidate(rate: f64, max_drafts: usize) -> Candidate {
        Candidate {
            first: rate,
            later: rate,
            max_drafts,
        }
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
    fn a_row_count_seen_often_stands_for_itself() {
        // Memory-bound: 2 rows cost hardly more than 1; 9 rows twice as much.
        let mut fit = StepTimeFit::default();
        for _ in 0..20 {
            for (rows, ms) in [(1, 8.0), (2, 8.2), (9, 16.0)] {
                fit.observe(rows, ms / 1e3);
            }
        }
        let seconds = fit.curve().unwrap();
        let ms = |rows| seconds(rows) * 1e3;
        assert!((ms(1) - 8.0).abs() < 1e-9 && (ms(2) - 8.2).abs() < 1e-9);
        assert!((ms(9) - 16.0).abs() < 1e-9);
        // Unseen counts: the line through them all.
        let line = fit.estimate().unwrap();
        assert!((ms(5) - line.seconds(5) * 1e3).abs() < 1e-9);
        assert!(ms(5) > 8.2 && ms(5) < 16.0);
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
        let counts = choose(line(8.0, 0.3), 1, 1.0, &[candidate(0.9, 8)], 8);
        assert_eq!(counts, [8]);
        // An open answer (p = 0.3): the first drafts still pay, p^j falls fast.
        let counts = choose(line(8.0, 0.3), 1, 1.0, &[candidate(0.3, 8)], 8);
        assert!((1..=3).contains(&counts[0]), "{counts:?}");
    }

    #[test]
    fn a_row_that_costs_a_step_takes_only_near_certain_drafts() {
        // Weights in cache: a row is most of a step.
        assert_eq!(
            choose(line(0.01, 0.06), 1, 1.0, &[candidate(0.5, 8)], 8),
            [0]
        );
        let counts = choose(line(0.01, 0.06), 1, 1.0, &[candidate(0.98, 8)], 8);
        assert!(counts[0] >= 1, "{counts:?}");
    }

    #[test]
    fn the_likeliest_drafts_win_between_sequences() {
        // Four decode rows: 10 ms + 1 ms a row. The copying sequence drafts, the others less
        // or not at all.
        let candidates = [candidate(0.2, 8), candidate(0.95, 8), candidate(0.5, 8)];
        let counts = choose(line(10.0, 1.0), 4, 4.0, &candidates, 12);
        assert!(counts[1] >= 4, "{counts:?}");
        assert!(
            counts[1] > counts[2] && counts[2] >= counts[0],
            "{counts:?}"
        );
        // The step's room caps the total.
        let counts = choose(line(10.0, 1.0), 4, 4.0, &candidates, 3);
        assert_eq!(counts.iter().sum::<usize>(), 3);
        assert_eq!(counts[1], 3);
    }

    #[test]
    fn free_rows_fill_the_room_in_order() {
        let candidates = [candidate(0.1, 5), candidate(0.9, 8), candidate(0.5, 8)];
        assert_eq!(fill(&candidates, 9), [5, 4, 0]);
        assert_eq!(fill(&candidates, 0), [0, 0, 0]);
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
                        // First and later rates apart, both ways round.
                        let cs = [
                            Candidate {
                                first: a,
                                later: b,
                                max_drafts: 8,
                            },
                            Candidate {
                                first: b,
                                later: a,
                                max_drafts: 8,
                            },
                        ];
                        let counts = choose(line(fixed, row), 2, 2.0, &cs, 16);
                        let rate = |counts: &[usize]| {
                            let tokens: f64 = 2.0
                                + cs.iter()
                                    .zip(counts)
                                    .map(|(c, &k)| {
                                        (1..=k)
                                            .map(|j| c.first * c.later.powi(j as i32 - 1))
                                            .sum::<f64>()
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
    fn runs_of_kept_drafts_raise_the_later_rate() {
        // A copied span: the first draft of a step is a coin toss, the ones after a kept
        // draft are nearly always right; a row costing 1/8 of a step takes the run.
        let copying = Candidate {
            first: 0.5,
            later: 0.95,
            max_drafts: 8,
        };
        assert_eq!(choose(line(8.0, 1.0), 1, 1.0, &[copying], 8), [8]);
        assert!(choose(line(8.0, 1.0), 1, 1.0, &[candidate(0.5, 8)], 8)[0] <= 2);
    }

    #[test]
    fn a_sequence_starts_from_the_overall_rates() {
        let mut overall = Acceptance::INITIAL;
        for _ in 0..2000 {
            overall.record_overall(0, true);
            overall.record_overall(1, false);
        }
        let (first, later) = Acceptance::default().rates_with_prior(&overall);
        assert!(first > 0.97 && later < 0.03, "{first} {later}");
        let mut seq = Acceptance::default();
        for _ in 0..9 {
            seq.record(0, false);
        }
        seq.record(3, true);
        // Nine misses against four drafts' worth of the overall first rate (~1): ~4 / 13.
        let (first, later) = seq.rates_with_prior(&overall);
        assert!((first - 4.0 / 13.0).abs() < 0.01, "{first}");
        // One kept against four drafts' worth of ~0: ~1 / 5.
        assert!((later - 0.2).abs() < 0.01, "{later}");
    }
}
