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
//! Cost: O(vocab) per token, plus O(k log k) for the kept candidates: the candidates are found
//! by filtering passes that compare 16 logits at a time, never by sorting the vocabulary
//! (which took 0.4 ms a draw with top-k 40 over Qwen2.5's 151,936 logits, 4.5 ms with top-k
//! off, in every decode step for every sampled sequence; now 16 and 184 µs, `cargo bench -p
//! airs-engine --bench sampler`), with the draws of the sort (tested against it).

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
    /// Added to the logits of these tokens before the penalties, as llama.cpp's logit-bias
    /// sampler (OpenAI's `logit_bias`); −∞ bans a token.
    pub logit_bias: Vec<(u32, f32)>,
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
            logit_bias: Vec::new(),
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
    /// The candidates of the current draw, reused from draw to draw.
    candidates: Vec<(u32, f32)>,
    /// The penalized logits of the current draw, reused from draw to draw.
    penalized: Vec<f32>,
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

/// The order candidates are ranked in: the larger logit first (by `total_cmp`, so that NaNs and
/// signed zeros have a place), then the lower id. A strict total order over distinct ids, so
/// every sort by it gives one result.
fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Sort `cands` in [`by_logit_desc`] order. Past a few hundred candidates (a flat
/// distribution's head, or the whole vocabulary), as `u64` keys — the logit's `total_cmp` rank
/// inverted in the high half, the id in the low — which sort by plain integer compares, several
/// times faster than the comparator over pairs; the order is the same, the comparator being a
/// strict total order.
fn sort_by_logit_desc(cands: &mut [(u32, f32)]) {
    if cands.len() < 256 {
        cands.sort_unstable_by(by_logit_desc);
        return;
    }
    // `total_cmp`'s order as unsigned integers: negative values' bits inverted, positive ones'
    // sign bit set.
    let rank = |l: f32| {
        let bits = l.to_bits();
        if bits >> 31 == 1 {
            !bits
        } else {
            bits | 1 << 31
        }
    };
    let mut keys: Vec<u64> = cands
        .iter()
        .map(|&(id, l)| (u64::from(!rank(l)) << 32) | u64::from(id))
        .collect();
    keys.sort_unstable();
    for (c, k) in cands.iter_mut().zip(keys) {
        let bits = !(k >> 32) as u32;
        let bits = if bits >> 31 == 1 {
            bits & !(1 << 31)
        } else {
            !bits
        };
        *c = (k as u32, f32::from_bits(bits));
    }
}

/// Logits looked at together by the filtering passes ([`top_k`], [`head`]): a block's
/// comparisons are one vector compare, and most blocks hold no candidate.
const LANES: usize = 16;

/// Whether `l` may rank at or above `floor` in [`by_logit_desc`] order: not numerically below
/// it, which a NaN on either side is not.
#[inline(always)]
#[allow(clippy::neg_cmp_op_on_partial_ord)]
fn not_below(l: f32, floor: f32) -> bool {
    !(l < floor)
}

/// Into `out`, the `k` best of `(id, logits[id])` in [`by_logit_desc`] order, sorted: what
/// sorting every logit and keeping the first `k` gives, in one pass. A logit becomes a
/// candidate unless it is below the `k`-th best found so far (16 logits compared at a time,
/// most blocks having none), and the candidates are cut back to their `k` best whenever they
/// reach `2k` (at least `k + 64`), which raises that floor. Cost: O(vocab) compares plus
/// O(k) per cut; the sort it replaces took 0.4 ms for Qwen2.5's 151,936 logits and k = 40
/// (`cargo bench -p airs-engine --bench sampler`).
fn top_k(logits: &[f32], k: usize, out: &mut Vec<(u32, f32)>) {
    out.clear();
    let k = k.min(logits.len());
    if k == 0 {
        return;
    }
    let cap = (2 * k).max(k + 64);
    // Every logit numerically below `floor` ranks below k others: `total_cmp` agrees with `<`
    // wherever `<` holds. (A NaN floor lets everything in, which the cuts sort out.)
    let mut floor = f32::NEG_INFINITY;
    let mut blocks = logits.chunks_exact(LANES);
    let mut first = 0;
    let take = |block: &[f32], first: usize, floor: &mut f32, out: &mut Vec<(u32, f32)>| {
        for (i, &l) in block.iter().enumerate() {
            if not_below(l, *floor) {
                out.push(((first + i) as u32, l));
            }
        }
        if out.len() >= cap {
            out.select_nth_unstable_by(k - 1, by_logit_desc);
            out.truncate(k);
            *floor = out[k - 1].1;
        }
    };
    for block in &mut blocks {
        if block
            .iter()
            .fold(false, |any, &l| any | not_below(l, floor))
        {
            take(block, first, &mut floor, out);
        }
        first += LANES;
    }
    take(blocks.remainder(), first, &mut floor, out);
    if out.len() > k {
        out.select_nth_unstable_by(k - 1, by_logit_desc);
        out.truncate(k);
    }
    sort_by_logit_desc(out);
}

/// How far below the largest logit a candidate's softmax weight stops counting: `exp(−17.5)`
/// ≈ 2.5·10⁻⁸ is under 2⁻²⁵, half an ulp of any f32 from 0.5 up, so adding such a weight to a
/// sum that holds the largest's `exp(0) = 1`, or such a probability to a cumulative sum past
/// one half, leaves the sum as it was.
const NEGLIGIBLE: f32 = -17.5;

/// Into `out`, sorted in [`by_logit_desc`] order, the candidates whose logit is within
/// `−cutoff` of the largest (`cutoff` at most [`NEGLIGIBLE`]): the head of the full sorted
/// list, the rest of which can only matter to the draw if top-p or min-p keeps it ([`kept`]
/// says), or the draw's walk runs past the head ([`walk`]). False when a logit is a NaN or the
/// largest is infinite, whose softmax only the full list computes as written. Cost: two passes
/// over the logits, and a sort of the head (49 tokens at the median position of real Qwen2.5
/// logits; nearly the whole vocabulary where the distribution is flat).
fn head(logits: &[f32], cutoff: f32, out: &mut Vec<(u32, f32)>) -> bool {
    debug_assert!(cutoff <= NEGLIGIBLE);
    let (max, nan) = crate::math::largest(logits);
    if nan || !max.is_finite() {
        return false;
    }
    // `l − max` as the softmax computes it (`max` may be −0.0 where the sorted list's first is
    // +0.0: the differences are the same for every logit that is not a zero, and a zero is in).
    out.clear();
    let mut blocks = logits.chunks_exact(LANES);
    let mut first = 0;
    let take = |block: &[f32], first: usize, out: &mut Vec<(u32, f32)>| {
        for (i, &l) in block.iter().enumerate() {
            if l - max >= cutoff {
                out.push(((first + i) as u32, l));
            }
        }
    };
    for block in &mut blocks {
        if block
            .iter()
            .fold(false, |any, &l| any | (l - max >= cutoff))
        {
            take(block, first, out);
        }
        first += LANES;
    }
    take(blocks.remainder(), first, out);
    sort_by_logit_desc(out);
    true
}

/// Where top-p and min-p cut a sorted candidate list ([`kept`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Cut {
    /// The first `n` candidates.
    Keep(usize),
    /// Every candidate: a head's tail included.
    All,
    /// Somewhere in a head's tail: only the whole list says.
    Unknown,
}

/// How many of `cands` (sorted in [`by_logit_desc`] order) top-p and min-p keep, as llama.cpp's
/// chain computes it: a softmax over the candidates (relative to the first, summed in order),
/// the shortest prefix whose probability reaches `top_p`, cut again before the first
/// probability under `min_p` × the largest. With `whole` false, `cands` is only the [`head`]
/// of the candidates, and the answer is [`Cut::Keep`] only where the cut falls inside it — the
/// bits are then those of the whole list: the tail leaves the softmax's sum, the cumulative
/// sum and the min-p test as they were. With `whole`, never [`Cut::Unknown`], and
/// [`Cut::All`] is `Keep(cands.len())`.
fn kept(cands: &[(u32, f32)], c: &SamplerConfig, whole: bool) -> Cut {
    let max = cands[0].1;
    let mut probs: Vec<f32> = cands.iter().map(|&(_, l)| (l - max).exp()).collect();
    let sum: f32 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= sum);
    // `None`: every candidate, the tail included.
    let mut keep = None;
    if c.top_p < 1.0 {
        let mut cum = 0.0;
        for (i, p) in probs.iter().enumerate() {
            cum += p;
            if cum >= c.top_p {
                keep = Some(i + 1);
                break;
            }
        }
        if keep.is_none() && !whole && cum < 0.5 {
            // The tail's probabilities might still move this sum (never seen: the head holds
            // nearly all the mass).
            return Cut::Unknown;
        }
    }
    if c.min_p > 0.0 {
        let floor = c.min_p * probs[0];
        let count = probs.iter().take_while(|&&p| p >= floor).count();
        // A head all above the floor: the tail's probabilities (under 2^-25) stop the count at
        // once if the floor is above them; else the count goes on, which matters only if
        // top-p did not cut first.
        if !whole && count == probs.len() && floor < 2f32.powi(-25) {
            return match keep {
                Some(n) if n <= count => Cut::Keep(n),
                _ => Cut::Unknown,
            };
        }
        keep = Some(keep.unwrap_or(cands.len()).min(count.max(1)));
    }
    match keep {
        Some(n) => Cut::Keep(n),
        None if whole => Cut::Keep(cands.len()),
        None => Cut::All,
    }
}

/// The draw over the kept candidates `cands` (sorted) at `temperature`, for the uniform draw
/// `u` in [0, 1): a walk down the list subtracting each candidate's weight
/// `exp((l − max) / temperature)` from `u × Σ weights` (summed in order) until it falls below
/// one (the last candidate if rounding carries it past every one). With `whole` false,
/// `cands` is a [`head`] whose tail's weights each fall under 2⁻²⁵ (their logits more than
/// 17.5 × max(temperature, 1) below the largest), so the sum is the whole list's; `None` if the
/// walk runs past the head, where only the whole list says what it meets.
#[inline(always)]
fn walk(cands: &[(u32, f32)], temperature: f32, u: f32, whole: bool) -> Option<u32> {
    let max = cands[0].1;
    let weights: Vec<f32> = cands
        .iter()
        .map(|&(_, l)| ((l - max) / temperature).exp())
        .collect();
    let total: f32 = weights.iter().sum();
    let mut r = u * total;
    for (&(id, _), w) in cands.iter().zip(&weights) {
        if r < *w {
            return Some(id);
        }
        r -= w;
    }
    whole.then(|| cands[cands.len() - 1].0)
}

impl Sampler {
    pub fn new(config: SamplerConfig) -> Sampler {
        let rng = Pcg32::new(config.seed);
        Sampler {
            config,
            rng,
            candidates: Vec::new(),
            penalized: Vec::new(),
        }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Choose the next token from `logits`, given the tokens so far (for the penalty).
    ///
    /// The candidates are found without sorting the vocabulary: top-k by one filtering pass
    /// ([`top_k`]); with top-k off, the head of the sorted list that the softmax and the
    /// draw's weights can see ([`head`]), unless top-p and min-p cut past it or the draw walks
    /// past it (about one draw in 2^24, when the uniform draw is within rounding of 1). Either
    /// way the kept candidates, their order and the draw are those of sorting every logit
    /// (tested against that reference).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let Sampler {
            config: c,
            rng,
            candidates: cands,
            penalized,
        } = self;
        let penalize = c.penalizes();
        let adjust = penalize || !c.logit_bias.is_empty();
        if c.temperature <= 0.0 && !adjust {
            return argmax(logits);
        }
        let logits = if adjust {
            penalized.clear();
            penalized.extend_from_slice(logits);
            for &(t, bias) in &c.logit_bias {
                if let Some(l) = penalized.get_mut(t as usize) {
                    *l += bias;
                }
            }
            if penalize {
                let recent = &history[history.len().saturating_sub(c.repeat_last_n)..];
                let mut counts: std::collections::HashMap<u32, u32> =
                    std::collections::HashMap::with_capacity(recent.len());
                for &t in recent {
                    *counts.entry(t).or_default() += 1;
                }
                for (&t, &count) in &counts {
                    if let Some(l) = penalized.get_mut(t as usize) {
                        *l = if *l > 0.0 {
                            *l / c.repeat_penalty
                        } else {
                            *l * c.repeat_penalty
                        };
                        *l -= count as f32 * c.frequency_penalty + c.presence_penalty;
                    }
                }
            }
            &penalized[..]
        } else {
            logits
        };
        if c.temperature <= 0.0 {
            return argmax(logits);
        }

        let cut = if c.top_k > 0 && c.top_k < logits.len() {
            top_k(logits, c.top_k, cands);
            kept(cands, c, true)
        } else if head(logits, NEGLIGIBLE * c.temperature.max(1.0), cands) {
            kept(cands, c, false)
        } else {
            Cut::Unknown
        };
        let u = rng.next_f32();
        match cut {
            Cut::Keep(n) => {
                cands.truncate(n);
                return walk(cands, c.temperature, u, true).expect("a whole list's draw");
            }
            Cut::All => {
                if let Some(id) = walk(cands, c.temperature, u, false) {
                    return id;
                }
            }
            Cut::Unknown => {}
        }
        // The whole vocabulary, sorted.
        cands.clear();
        cands.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        sort_by_logit_desc(cands);
        let Cut::Keep(n) = kept(cands, c, true) else {
            unreachable!("the whole list decides")
        };
        cands.truncate(n);
        walk(cands, c.temperature, u, true).expect("a whole list's draw")
    }
}

/// log Σ exp(logits): what the log-softmax subtracts (computed around the largest logit, summed
/// in f64).
///
/// The largest by [`crate::math::largest`]; the sum in [`PARTITION_SUMS`] partial sums combined
/// pairwise, of the vectorizable [`crate::math::exp_f64`]: one order in every build, compiled
/// for AVX-512 and AVX2 where the CPU has them (the same bits: nothing is fused). It took
/// 0.7 ms over Qwen2.5's 151,936 logits with libm's `exp` in one chain, for every token a
/// client asks log-probabilities of.
pub fn log_partition(logits: &[f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512 F (checked just above), all the function enables.
            return unsafe { log_partition_avx512(logits) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above), all the function enables.
            return unsafe { log_partition_avx2(logits) };
        }
    }
    log_partition_any(logits)
}

/// Partial sums of [`log_partition`]: enough independent chains of `exp_f64`'s polynomial
/// (4 AVX-512 registers) that its latency hides.
const PARTITION_SUMS: usize = 32;

/// [`log_partition`] compiled for AVX-512.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn log_partition_avx512(logits: &[f32]) -> f64 {
    log_partition_any(logits)
}

/// [`log_partition`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn log_partition_avx2(logits: &[f32]) -> f64 {
    log_partition_any(logits)
}

/// The body of [`log_partition`], inlined into each build.
#[inline(always)]
fn log_partition_any(logits: &[f32]) -> f64 {
    let (max, _) = crate::math::largest(logits);
    let term = |l: f32| crate::math::exp_f64(f64::from(l - max));
    let mut sums = [0.0f64; PARTITION_SUMS];
    let mut blocks = logits.chunks_exact(PARTITION_SUMS);
    for block in &mut blocks {
        for (s, &l) in sums.iter_mut().zip(block) {
            *s += term(l);
        }
    }
    let mut width = PARTITION_SUMS;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            sums[i] += sums[i + width];
        }
    }
    let mut sum = sums[0];
    for &l in blocks.remainder() {
        sum += term(l);
    }
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
    let mut best = Vec::new();
    top_k(logits, top, &mut best);
    let best = best.into_iter().map(|(i, l)| (i, lp(l))).collect();
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

    /// What `Sampler::sample` computed before it filtered: every logit sorted, then top-k,
    /// top-p, min-p, temperature and the draw over that list.
    fn sample_by_sorting_everything(c: &SamplerConfig, rng: &mut Pcg32, logits: &[f32]) -> u32 {
        if c.temperature <= 0.0 {
            return argmax(logits);
        }
        let mut cands: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        if c.top_k > 0 && c.top_k < cands.len() {
            cands.select_nth_unstable_by(c.top_k - 1, by_logit_desc);
            cands.truncate(c.top_k);
        }
        cands.sort_unstable_by(by_logit_desc);
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
        let weights: Vec<f32> = cands
            .iter()
            .map(|&(_, l)| ((l - max) / c.temperature).exp())
            .collect();
        let total: f32 = weights.iter().sum();
        let mut r = rng.next_f32() * total;
        for (&(id, _), w) in cands.iter().zip(&weights) {
            if r < *w {
                return id;
            }
            r -= w;
        }
        cands[cands.len() - 1].0
    }

    /// `draws` tokens from `logits` by the sampler and by the reference, with one seed.
    fn both_ways(c: &SamplerConfig, logits: &[f32], draws: usize) -> (Vec<u32>, Vec<u32>) {
        let mut s = Sampler::new(c.clone());
        let mut rng = Pcg32::new(c.seed);
        (0..draws)
            .map(|_| {
                (
                    s.sample(logits, &[]),
                    sample_by_sorting_everything(c, &mut rng, logits),
                )
            })
            .unzip()
    }

    /// Sampler settings around the ones clients send, top-k on and off.
    fn config() -> impl Strategy<Value = SamplerConfig> {
        (
            prop_oneof![Just(0.0f32), 0.05f32..3.0],
            prop_oneof![Just(0usize), 1usize..50, Just(100_000usize)],
            prop_oneof![Just(1.0f32), 0.0f32..1.0, Just(0.999_999_9)],
            prop_oneof![Just(0.0f32), 0.0f32..0.5, Just(1e-9), Just(2.0)],
            any::<u64>(),
        )
            .prop_map(|(temperature, top_k, top_p, min_p, seed)| SamplerConfig {
                temperature,
                top_k,
                top_p,
                min_p,
                seed,
                ..SamplerConfig::default()
            })
    }

    /// Logits with a wide spread (a long tail under the head's cutoff), or from a small set of
    /// values (ties, zeros, infinities, NaNs).
    fn logits() -> impl Strategy<Value = Vec<f32>> {
        prop_oneof![
            proptest::collection::vec(-40.0f32..40.0, 1..600),
            proptest::collection::vec(-3.0f32..3.0, 1..600),
            proptest::collection::vec(logit(), 1..80),
            proptest::collection::vec(logit(), 256..400),
        ]
    }

    proptest! {
        #[test]
        fn filtered_draws_equal_draws_from_the_fully_sorted_vocabulary(
            c in config(),
            logits in logits(),
        ) {
            let (fast, reference) = both_ways(&c, &logits, 4);
            prop_assert_eq!(fast, reference);
        }

        #[test]
        fn key_sort_orders_as_the_comparator(
            logits in prop_oneof![
                proptest::collection::vec(logit(), 250..900),
                proptest::collection::vec(-40.0f32..40.0, 250..900),
            ],
        ) {
            let pairs: Vec<(u32, f32)> =
                logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
            let mut want = pairs.clone();
            want.sort_unstable_by(by_logit_desc);
            let mut got = pairs;
            sort_by_logit_desc(&mut got);
            prop_assert_eq!(
                got.iter().map(|c| (c.0, c.1.to_bits())).collect::<Vec<_>>(),
                want.iter().map(|c| (c.0, c.1.to_bits())).collect::<Vec<_>>()
            );
        }

        #[test]
        fn top_k_keeps_the_first_k_of_the_sorted_list(
            logits in logits(),
            k in 0usize..700,
        ) {
            let mut sorted: Vec<(u32, f32)> =
                logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
            sorted.sort_unstable_by(by_logit_desc);
            sorted.truncate(k);
            let mut out = Vec::new();
            top_k(&logits, k, &mut out);
            prop_assert_eq!(
                out.iter().map(|c| (c.0, c.1.to_bits())).collect::<Vec<_>>(),
                sorted.iter().map(|c| (c.0, c.1.to_bits())).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn a_walk_past_the_head_is_left_to_the_whole_list() {
        // u × total = 1 is not below the one weight 1, so the walk runs off the list's end.
        let head = [(3, 0.5f32)];
        assert_eq!(walk(&head, 1.0, 1.0, false), None);
        assert_eq!(walk(&head, 1.0, 1.0, true), Some(3));
        assert_eq!(walk(&head, 1.0, 0.5, false), Some(3));
    }

    #[test]
    fn draws_over_a_whole_vocabulary_equal_the_sorted_reference() {
        // Qwen2.5's vocabulary: a broad band, a few hundred tokens above it, logits rising
        // through the vocabulary (every block raises top-k's floor) and falling.
        let vocab = 151_936;
        let mut x = 1u64;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 40) as f32 / (1u64 << 24) as f32
        };
        let band: Vec<f32> = (0..vocab)
            .map(|_| {
                let l = (next() + next() - 1.0) * 8.0;
                if next() < 0.002 { l + 14.0 } else { l }
            })
            .collect();
        let rising: Vec<f32> = (0..vocab).map(|i| i as f32 * 1e-3).collect();
        let falling: Vec<f32> = rising.iter().rev().copied().collect();
        let chat = SamplerConfig {
            temperature: 0.8,
            seed: 5,
            ..SamplerConfig::default()
        };
        for logits in [&band, &rising, &falling] {
            for c in [
                chat.clone(),
                SamplerConfig {
                    top_k: 0,
                    ..chat.clone()
                },
                SamplerConfig {
                    top_k: 0,
                    min_p: 0.0,
                    ..chat.clone()
                },
                SamplerConfig {
                    top_k: 0,
                    top_p: 1.0,
                    min_p: 0.0,
                    temperature: 1.5,
                    ..chat.clone()
                },
                SamplerConfig {
                    top_k: 1000,
                    top_p: 1.0,
                    min_p: 0.0,
                    ..chat.clone()
                },
            ] {
                let (fast, reference) = both_ways(&c, logits, 16);
                assert_eq!(fast, reference, "{c:?}");
            }
        }
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

    #[test]
    fn logit_bias_moves_greedy_and_sampled_draws_and_minus_infinity_bans() {
        let logits = [2.0, 1.9, -1.0, 0.5];
        let greedy = |bias: Vec<(u32, f32)>| {
            Sampler::new(SamplerConfig {
                logit_bias: bias,
                ..SamplerConfig::default()
            })
            .sample(&logits, &[])
        };
        assert_eq!(greedy(vec![]), 0);
        assert_eq!(greedy(vec![(1, 0.2)]), 1);
        assert_eq!(
            greedy(vec![(0, f32::NEG_INFINITY), (1, f32::NEG_INFINITY)]),
            3
        );
        assert_eq!(greedy(vec![(2, 100.0), (99, 5.0)]), 2);
        // Applied before the penalties: (2.0 - 2.5) · 2 = -1.0 > -1.2 (penalty first would
        // give 2.0 / 2 - 2.5 = -1.5).
        let mut s = Sampler::new(SamplerConfig {
            logit_bias: vec![(0, -2.5)],
            repeat_penalty: 2.0,
            ..SamplerConfig::default()
        });
        assert_eq!(s.sample(&[2.0, -1.2, -5.0], &[0]), 0);
        let mut s = Sampler::new(SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            logit_bias: vec![(0, f32::NEG_INFINITY), (1, f32::NEG_INFINITY)],
            seed: 3,
            ..SamplerConfig::default()
        });
        for _ in 0..1000 {
            assert!(matches!(s.sample(&logits, &[]), 2 | 3));
        }
    }
}
