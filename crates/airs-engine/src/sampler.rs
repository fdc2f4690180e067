//! Token sampling: greedy, or temperature with top-k, top-p (nucleus) and min-p filtering, with
//! repetition, frequency and presence penalties, driven by a seeded PCG32 generator so a seed
//! reproduces a generation; and the log-probabilities a client may ask for.
//!
//! The filter order follows llama.cpp's default sampler chain (penalties → top-k → top-p →
//! min-p → temperature → draw). The penalties are llama.cpp's `penalties` sampler: over the last
//! `repeat_last_n` tokens of the sequence (prompt and generated), a token seen `c` times has its
//! logit divided by `repeat_penalty` (multiplied if negative), then lowered by
//! `c × frequency_penalty + presence_penalty` (OpenAI's definition of the two). Greedy is an
//! argmax with ties going to the lowest id, as in the reference outputs. Log-probabilities are
//! those of the model's distribution (log-softmax of the raw logits, before penalties and
//! temperature), as vLLM and OpenAI report them.
//! Cost: O(vocab) per token, plus O(k log k) for the kept candidates.

/// Sampling parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// 0 means greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p` (1.0 = all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one (0 = none).
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of recently seen tokens by this (1 = off).
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Subtract `frequency_penalty × count` from the logit of each recently seen token (0 = off).
    pub frequency_penalty: f32,
    /// Subtract `presence_penalty` from the logit of each recently seen token (0 = off).
    pub presence_penalty: f32,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> SamplerConfig {
        SamplerConfig {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Whether any penalty is active.
    pub fn penalizes(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.frequency_penalty != 0.0
                || self.presence_penalty != 0.0)
    }
}

/// A PCG32 generator (O'Neill's pcg32_random_r): small, fast, and reproducible everywhere.
#[derive(Clone, Debug)]
pub struct Pcg32 {
    state: u64,
    inc: u64,
}

impl Pcg32 {
    pub fn new(seed: u64) -> Pcg32 {
        let mut rng = Pcg32 {
            state: 0,
            inc: (0xda3e_39cb_94b9_5bdb << 1) | 1,
        };
        rng.next_u32();
        rng.state = rng.state.wrapping_add(seed);
        rng.next_u32();
        rng
    }

    pub fn next_u32(&mut self) -> u32 {
        let old = self.state;
        self.state = old
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(self.inc);
        let xorshifted = (((old >> 18) ^ old) >> 27) as u32;
        let rot = (old >> 59) as u32;
        xorshifted.rotate_right(rot)
    }

    /// A uniform float in [0, 1).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
    }
}

/// A sampler: configuration plus generator state.
#[derive(Clone, Debug)]
pub struct Sampler {
    config: SamplerConfig,
    rng: Pcg32,
    candidates: Vec<(u32, f32)>,
}

/// Index of the largest value, ties to the lowest index: what a scan from index 0 that moves
/// to every value greater than the best so far returns (a NaN never compares greater, so it is
/// skipped, and a NaN at index 0 is kept).
///
/// Computed in two passes that vectorize: the largest value in 16 independent lanes, then the
/// first block of 16 that holds it. The scan itself is one chain of dependent compares, ~110 µs
/// over Qwen's 151,936 logits: serial work per sequence in every decode step.
pub fn argmax(logits: &[f32]) -> u32 {
    const LANES: usize = 16;
    let Some(&first) = logits.first() else {
        return 0;
    };
    if first.is_nan() {
        return 0;
    }
    let mut lanes = [first; LANES];
    let mut blocks = logits.chunks_exact(LANES);
    for block in &mut blocks {
        for (m, &l) in lanes.iter_mut().zip(block) {
            *m = if l > *m { l } else { *m };
        }
    }
    let mut max = first;
    for &l in lanes.iter().chain(blocks.remainder()) {
        if l > max {
            max = l;
        }
    }
    // The scan stops moving at the first value equal to the largest (−0.0 equals 0.0, and
    // whichever of the two comes first is the scan's answer too).
    let block = logits
        .chunks(LANES)
        .position(|b| b.iter().fold(false, |hit, &l| hit | (l == max)))
        .unwrap_or(0);
    let at = logits[block * LANES..]
        .iter()
        .position(|&l| l == max)
        .unwrap_or(0);
    (block * LANES + at) as u32
}

impl Sampler {
    pub fn new(config: SamplerConfig) -> Sampler {
        let rng = Pcg32::new(config.seed);
        Sampler {
            config,
            rng,
            candidates: Vec::new(),
        }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Choose the next token from `logits`, given the tokens so far (for the penalty).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let c = &self.config;
        let penalize = c.penalizes();
        if c.temperature <= 0.0 && !penalize {
            return argmax(logits);
        }
        let mut logits_buf;
        let logits = if penalize {
            logits_buf = logits.to_vec();
            let recent = &history[history.len().saturating_sub(c.repeat_last_n)..];
            let mut counts: std::collections::HashMap<u32, u32> =
                std::collections::HashMap::with_capacity(recent.len());
            for &t in recent {
                *counts.entry(t).or_default() += 1;
            }
            for (&t, &count) in &counts {
                if let Some(l) = logits_buf.get_mut(t as usize) {
                    *l = if *l > 0.0 {
                        *l / c.repeat_penalty
                    } else {
                        *l * c.repeat_penalty
                    };
                    *l -= count as f32 * c.frequency_penalty + c.presence_penalty;
                }
            }
            &logits_buf[..]
        } else {
            logits
        };
        if c.temperature <= 0.0 {
            return argmax(logits);
        }

        let cands = &mut self.candidates;
        cands.clear();
        cands.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        let by_logit_desc =
            |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if c.top_k > 0 && c.top_k < cands.len() {
            cands.select_nth_unstable_by(c.top_k - 1, by_logit_desc);
            cands.truncate(c.top_k);
        }
        cands.sort_unstable_by(by_logit_desc);
        // Softmax over the survivors (before temperature, as llama.cpp's top-p/min-p see them).
        let max = cands[0].1;
        let mut probs: Vec<f32> = cands.iter().map(|&(_, l)| (l - max).exp()).collect();
        let sum: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= sum);
        let mut keep = cands.len();
        if c.top_p < 1.0 {
            let mut cum = 0.0;
            for (i, p) in probs.iter().enumerate() {
                cum += p;
                if cum >= c.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        if c.min_p > 0.0 {
            let floor = c.min_p * probs[0];
            keep = keep.min(probs.iter().take_while(|&&p| p >= floor).count().max(1));
        }
        cands.truncate(keep);
        // Temperature, then draw.
        let weights: Vec<f32> = cands
            .iter()
            .map(|&(_, l)| ((l - max) / c.temperature).exp())
            .collect();
        let total: f32 = weights.iter().sum();
        let mut r = self.rng.next_f32() * total;
        for (&(id, _), w) in cands.iter().zip(&weights) {
            if r < *w {
                return id;
            }
            r -= w;
        }
        cands[cands.len() - 1].0
    }
}

/// log Σ exp(logits): what the log-softmax subtracts (computed around the largest logit, summed
/// in f64).
pub fn log_partition(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    f64::from(max) + sum.ln()
}

/// The log-probability of `chosen` and the `top` most likely tokens (most likely first, ties to
/// the lowest id) under the model's distribution: the log-softmax of `logits`.
pub fn logprobs(logits: &[f32], chosen: u32, top: usize) -> (f32, Vec<(u32, f32)>) {
    let log_z = log_partition(logits) as f32;
    let lp = |l: f32| l - log_z;
    let chosen_lp = logits
        .get(chosen as usize)
        .map_or(f32::NEG_INFINITY, |&l| lp(l));
    let top = top.min(logits.len());
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    let by_logit_desc = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    if top > 0 && top < ids.len() {
        ids.select_nth_unstable_by(top - 1, by_logit_desc);
        ids.truncate(top);
    } else {
        ids.truncate(top);
    }
    ids.sort_unstable_by(by_logit_desc);
    let best = ids
        .into_iter()
        .map(|i| (i, lp(logits[i as usize])))
        .collect();
    (chosen_lp, best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The scan `argmax` computes in two vectorized passes.
    fn scan(logits: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &l) in logits.iter().enumerate() {
            if l > logits[best] {
                best = i;
            }
        }
        best as u32
    }

    /// Logits from a small set of values, so that ties, signed zeros, infinities and NaNs
    /// come up often.
    fn logit() -> impl Strategy<Value = f32> {
        prop_oneof![
            (-4i32..4).prop_map(|v| v as f32),
            Just(-0.0f32),
            Just(f32::INFINITY),
            Just(f32::NEG_INFINITY),
            Just(f32::NAN),
            any::<f32>(),
        ]
    }

    proptest! {
        #[test]
        fn argmax_is_the_scan_for_ties_zeros_infinities_and_nans(
            logits in proptest::collection::vec(logit(), 0..80),
        ) {
            prop_assert_eq!(argmax(&logits), scan(&logits));
        }
    }

    #[test]
    fn argmax_finds_the_first_largest_value_in_a_vocabulary() {
        let mut logits: Vec<f32> = (0..151_936).map(|i| ((i * 7919) % 1000) as f32).collect();
        logits[123_457] = 2000.0;
        logits[140_000] = 2000.0;
        assert_eq!(argmax(&logits), 123_457);
        assert_eq!(argmax(&logits), scan(&logits));
    }

    #[test]
    fn greedy_takes_the_argmax_with_ties_to_the_lowest_id() {
        let mut s = Sampler::new(SamplerConfig::default());
        assert_eq!(s.sample(&[0.0, 3.0, 1.0, 3.0], &[]), 1);
    }

    #[test]
    fn the_same_seed_reproduces_the_same_draws() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 42,
            ..SamplerConfig::default()
        };
        let draw = |cfg: &SamplerConfig| {
            let mut s = Sampler::new(cfg.clone());
            (0..50).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
        };
        assert_eq!(draw(&cfg), draw(&cfg));
        assert_ne!(
            draw(&cfg),
            draw(&SamplerConfig {
                seed: 43,
                ..cfg.clone()
            })
        );
    }

    #[test]
    fn top_k_one_is_greedy_even_when_hot() {
        let logits = [0.1, 0.5, 2.0, 1.9];
        let mut s = Sampler::new(SamplerConfig {
            temperature: 5.0,
            top_k: 1,
            ..SamplerConfig::default()
        });
        assert!((0..100).all(|_| s.sample(&logits, &[]) == 2));
    }

    #[test]
    fn top_p_and_min_p_cut_the_unlikely_tail() {
        // Token 0 holds almost all the mass: top-p 0.5 keeps only it.
        let logits = [10.0, 0.0, 0.0, 0.0];
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            ..SamplerConfig::default()
        });
        assert!((0..100).all(|_| s.sample(&logits, &[]) == 0));
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            ..SamplerConfig::default()
        });
        let flat = [1.0, 1.0, -5.0, -5.0];
        assert!((0..200).all(|_| s.sample(&flat, &[]) < 2));
    }

    #[test]
    fn sampling_follows_the_distribution() {
        // p(1) = e / (1 + e) ≈ 0.731 at temperature 1.
        let logits = [0.0, 1.0];
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 7,
            ..SamplerConfig::default()
        });
        let ones = (0..10_000).filter(|_| s.sample(&logits, &[]) == 1).count();
        assert!((7_000..7_600).contains(&ones), "{ones}");
    }

    #[test]
    fn frequency_and_presence_penalties_follow_the_counts() {
        // Token 0 seen twice, token 1 once: 2.0 - 2·0.3 - 0.5 = 0.9 < 1.9 - 0.3 - 0.5 = 1.1.
        let logits = [2.0, 1.9, 1.0];
        let mut s = Sampler::new(SamplerConfig {
            frequency_penalty: 0.3,
            presence_penalty: 0.5,
            ..SamplerConfig::default()
        });
        assert_eq!(s.sample(&logits, &[0, 0, 1]), 1);
        // Both seen: 0.9 vs 1.1 vs the unseen 1.0.
        assert_eq!(s.sample(&[2.0, 1.9, 1.05], &[0, 0, 1]), 1);
        assert_eq!(s.sample(&[2.0, 1.9, 1.2], &[0, 0, 1]), 2);
    }

    #[test]
    fn logprobs_are_the_log_softmax_with_the_most_likely_first() {
        let logits = [1.0f32, 3.0, 2.0, 3.0];
        let (chosen, top) = logprobs(&logits, 2, 3);
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        assert!((f64::from(chosen) - (2.0 - z.ln())).abs() < 1e-6);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 3, 2]);
        let total: f64 = logits
            .iter()
            .map(|&l| f64::from(l) - z.ln())
            .map(f64::exp)
            .sum();
        assert!((total - 1.0).abs() < 1e-9);
        assert!(logprobs(&logits, 0, 0).1.is_empty());
        assert_eq!(logprobs(&logits, 0, 10).1.len(), 4);
    }

    #[test]
    fn repetition_penalty_demotes_seen_tokens() {
        let logits = [2.0, 1.9, -1.0];
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 1.5,
            ..SamplerConfig::default()
        });
        assert_eq!(s.sample(&logits, &[0]), 1);
        assert_eq!(s.sample(&logits, &[]), 0);
    }
}
