//! Draft tokens by prompt lookup: the scheduler's speculative decoding.
//!
//! A decoding sequence's step computes one row: its pending token's. In the memory-bound
//! regime (one or a few sequences) a row more costs little — the weights are read once a step
//! whatever its rows — so a step can also compute *draft* tokens after the pending one and keep
//! those the model would have produced anyway. The drafts come from the sequence itself: the
//! longest recent n-gram that ends the sequence is looked up earlier in it, and the tokens that
//! followed it there are proposed ("prompt lookup decoding", Saxena 2023; vLLM's `ngram`
//! proposer). Editing code, answering about a document, quoting a conversation: the reply copies
//! spans of its context, and those spans are drafted right.
//!
//! Verification ([`crate::scheduler`]) draws from each row's logits exactly as decoding would —
//! same sampler, same random stream, same constraint — and keeps a draft only if the token drawn
//! before it is that draft. The kernels are batch-invariant (a row's logits do not depend on
//! the rows computed with it), so a kept draft's row holds the logits the next step would have
//! computed: the tokens are those of decoding one at a time, for greedy and sampled requests
//! alike, and only their speed changes. Drafts the verification rejects cost their rows and
//! their KV positions, which are forgotten ([`airs_engine::PagedKv::truncate`]).
//!
//! What bounds the cost: each decoding sequence drafts at most `max_tokens` tokens a step, a
//! step with drafts computes at most [`DraftConfig::step_rows`] rows, and drafts take only free
//! blocks, never evicting or preempting. Within those limits [`crate::draft_cost`] decides how
//! many drafts each sequence computes from what a row is measured to cost and how often the
//! sequence's drafts were kept. Measured with `airs bench draft` (BENCHMARKS.md):
//! Qwen2.5-Coder-0.5B renaming a function in a module it repeats decodes 2.9-4.5× faster
//! alone, an open question about 1.1×.
//!
//! Cost: a lookup scans the sequence backwards once per n-gram length, O(len × ngram_max)
//! comparisons a step (a 4,096-token sequence: about 16 k, a few microseconds); no allocation.

use std::ops::Range;

/// The draft tokens `airs run` and `airs serve` compute a step unless told otherwise.
pub const DEFAULT_DRAFT_TOKENS: usize = 8;

/// When and how the scheduler drafts tokens (see the module documentation).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DraftConfig {
    /// Most draft tokens a sequence computes a step; 0 turns speculation off.
    pub max_tokens: usize,
    /// The longest and the shortest n-gram looked up: the longest that matches wins.
    pub ngram_max: usize,
    pub ngram_min: usize,
    /// How the number of drafts is chosen within the limits.
    pub cost: DraftCost,
}

/// How the scheduler weighs a draft's row against the tokens it may save.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum DraftCost {
    /// By the step times it measures ([`crate::draft_cost`]): what `airs run` and `airs serve`
    /// do.
    #[default]
    Measured,
    /// As if rows cost nothing: every draft the limits allow, most important sequence first.
    /// The work then depends on the tokens alone (tests, benchmarks that pin it).
    Free,
    /// As if a step cost `fixed_nanos + row_nanos × rows`, whatever it is measured to cost
    /// (tests of the choice).
    Fixed { fixed_nanos: u64, row_nanos: u64 },
}

impl DraftConfig {
    /// No speculation.
    pub const OFF: DraftConfig = DraftConfig {
        max_tokens: 0,
        ngram_max: 3,
        ngram_min: 2,
        cost: DraftCost::Measured,
    };

    /// Rows a step with drafts computes at most, unless `1 + max_tokens` is more: past 16
    /// rows a product leaves the row kernels (`airs_kernels::rows16`) for the tiled ones,
    /// whose cost per row is another line than the one [`crate::draft_cost`] fits. (With 18
    /// and 36 rows, two and four sequences copying code ran 1.27× and 0.81× before the cost
    /// was measured; BENCHMARKS.md.)
    pub const STEP_ROWS: usize = 16;

    /// Up to `max_tokens` drafts a sequence and step from 3- or 2-grams, as many as their
    /// measured cost pays for.
    pub fn with_tokens(max_tokens: usize) -> DraftConfig {
        DraftConfig {
            max_tokens,
            ..DraftConfig::OFF
        }
    }

    /// The same, with every draft the limits allow ([`DraftCost::Free`]).
    pub fn free(self) -> DraftConfig {
        DraftConfig {
            cost: DraftCost::Free,
            ..self
        }
    }

    pub fn enabled(&self) -> bool {
        self.max_tokens > 0
    }

    /// Most rows a step with drafts computes, its decode and prefill rows included.
    pub fn step_rows(&self) -> usize {
        (1 + self.max_tokens).max(Self::STEP_ROWS)
    }
}

impl Default for DraftConfig {
    fn default() -> DraftConfig {
        DraftConfig::OFF
    }
}

/// Up to `max` draft tokens to follow `tokens`: what followed the most recent earlier
/// occurrence of its longest final n-gram (`ngram_max` down to `ngram_min` tokens); empty when
/// none occurs.
pub fn propose<'t>(tokens: &'t [u32], config: &DraftConfig, max: usize) -> &'t [u32] {
    &tokens[proposal(tokens, config, max)]
}

/// Where in `tokens` the drafts [`propose`] returns are: positions `from..from + count`, so
/// that a caller can take fewer of them later without looking them up again.
pub fn proposal(tokens: &[u32], config: &DraftConfig, max: usize) -> Range<usize> {
    let len = tokens.len();
    if max == 0 {
        return 0..0;
    }
    for n in (config.ngram_min.max(1)..=config.ngram_max).rev() {
        if len <= n {
            continue;
        }
        let suffix = &tokens[len - n..];
        // Occurrences starting at `start < len - n`: the latest first.
        let found = (0..len - n)
            .rev()
            .find(|&start| tokens[start..start + n] == *suffix);
        if let Some(start) = found {
            let from = start + n;
            return from..(from + max).min(len);
        }
    }
    0..0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(ngram_max: usize, ngram_min: usize) -> DraftConfig {
        DraftConfig {
            ngram_max,
            ngram_min,
            ..DraftConfig::with_tokens(8)
        }
    }

    #[test]
    fn the_longest_final_ngram_proposes_what_followed_it_last() {
        // "1 2 3 4 5 … 9 1 2 3 7 8 … 1 2 3": the 3-gram occurred twice; the latest wins.
        let t = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 6, 1, 2, 3];
        assert_eq!(propose(&t, &cfg(3, 2), 4), &[7, 8, 6, 1]);
        // Only two tokens follow the match before the end.
        let t = [5, 6, 7, 8, 5, 6];
        assert_eq!(propose(&t, &cfg(3, 2), 4), &[7, 8, 5, 6]);
        assert_eq!(propose(&t, &cfg(3, 2), 1), &[7]);
    }

    #[test]
    fn a_shorter_ngram_is_used_only_when_no_longer_one_matches() {
        // The 3-gram "9 1 2" never occurred; the 2-gram "1 2" did, twice.
        let t = [1, 2, 4, 1, 2, 5, 9, 1, 2];
        assert_eq!(propose(&t, &cfg(3, 2), 3), &[5, 9, 1]);
        // With 3-grams only, nothing.
        assert!(propose(&t, &cfg(3, 3), 3).is_empty());
    }

    #[test]
    fn repeated_tokens_draft_their_repetition() {
        let t = [7, 7, 7, 7];
        assert_eq!(propose(&t, &cfg(3, 2), 4), &[7]);
    }

    #[test]
    fn short_or_new_sequences_draft_nothing() {
        assert!(propose(&[], &cfg(3, 1), 4).is_empty());
        assert!(propose(&[1], &cfg(3, 1), 4).is_empty());
        assert!(propose(&[1, 2, 3, 4], &cfg(3, 1), 4).is_empty());
        assert!(propose(&[1, 2, 1, 2], &cfg(2, 2), 0).is_empty());
    }
}
