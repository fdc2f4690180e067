//! Forward-pass schedules: how a session's positions are split into forward passes, how they
//! were, and how to recompute a range of them so the KV rows come out bit for bit the same.
//!
//! Why it matters: a rebuilt cache must hold exactly the bits the original did, or a greedy
//! continuation can drift. Whether the split matters depends on the matrix kernels. Where every
//! kernel the model uses is bit-identical to the scalar reference for any number of activation
//! rows (`airs_kernels::matmul_matches_scalar`: the quantized kernels on AVX-512 VNNI and on
//! NEON with `sdot`), a token's row is the same in any pass, and recomputation may batch freely
//! ([`Schedule::Free`]). Elsewhere — f32/f16 weights, or CPUs without those kernels — a row can
//! depend on the length of the pass that computed it (measured on stories260K's f32 weights:
//! passes of 7, 9, 11 and 13 tokens give other bits than one pass of 40), so the runtime
//! computes in [`Schedule::Replay`]:
//! - new positions are computed in passes that never cross a KV block boundary (at most one
//!   block's worth of tokens each), decoded positions one per pass;
//! - the session's pass log records every pass's length, and a rebuild replays the passes
//!   after its restart point exactly;
//! - cached positions are reused only up to a block boundary (always a pass boundary), never
//!   by copying part of a block.
//!
//! Because passes are aligned to blocks, a full block computed by a prompt pass covers exactly
//! one pass of `tokens_per_block` tokens, whichever session computed it: prefix blocks shared
//! between sessions (a common system prompt) hold the bits each session would have computed
//! itself. (A block whose identical tokens reached two sessions by different routes — decoded
//! by one, part of the other's prompt — would not; sessions do not meet such blocks in
//! practice.) The price: prompts are computed in passes of at most one block (16 tokens by
//! default) where the kernels are not batch-invariant.
//!
//! Cost: planning is O(log entries).

/// How recomputation is scheduled (see the module documentation).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum RebuildMode {
    /// [`Schedule::Free`] where the model's kernels are batch-invariant, else
    /// [`Schedule::Replay`].
    #[default]
    Auto,
    /// Always [`Schedule::Replay`].
    Replay,
    /// Always [`Schedule::Free`] (exact only with batch-invariant kernels).
    Free,
}

/// The schedule in force.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// Any split: prompts in passes of up to `prefill_batch` tokens.
    Free,
    /// Block-aligned passes, exact replay (see the module documentation).
    Replay,
}

impl Schedule {
    pub fn name(self) -> &'static str {
        match self {
            Schedule::Free => "free",
            Schedule::Replay => "replay",
        }
    }
}

/// The pass lengths that compute positions `start..end` from scratch under `schedule`.
pub fn split(
    schedule: Schedule,
    start: usize,
    end: usize,
    tokens_per_block: usize,
    prefill_batch: usize,
) -> Vec<usize> {
    let mut out = Vec::new();
    match schedule {
        Schedule::Free => {
            let n = end.saturating_sub(start);
            if n > 0 {
                let k = n.div_ceil(prefill_batch.max(1));
                let (base, extra) = (n / k, n % k);
                out.extend((0..k).map(|i| base + usize::from(i < extra)));
            }
        }
        Schedule::Replay => {
            let max = tokens_per_block.min(prefill_batch).max(1);
            let mut at = start;
            while at < end {
                let block_end = (at / tokens_per_block + 1) * tokens_per_block;
                let next = block_end.min(at + max).min(end);
                out.push(next - at);
                at = next;
            }
        }
    }
    out
}

/// What a request computes before decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Forward passes over `start..end`, in order (token counts).
    pub passes: Vec<usize>,
    /// The session's pass log once they ran (covers `0..end`).
    pub log: Vec<u32>,
}

/// Plan the computation of positions `start..end` of a session whose pass `log` covers
/// `0..computed` (`computed < end`, `start < end`), positions `0..start` being already in the
/// cache. Under [`Schedule::Replay`], returns `None` unless `start` is a pass boundary (the
/// caller also requires positions taken from the prefix index to end on a block boundary);
/// starting at 0 is always possible.
pub fn plan(
    schedule: Schedule,
    log: &[u32],
    computed: usize,
    start: usize,
    end: usize,
    tokens_per_block: usize,
    prefill_batch: usize,
) -> Option<Plan> {
    debug_assert!(computed < end && start < end);
    let fresh = split(schedule, computed, end, tokens_per_block, prefill_batch);
    let mut new_log = log.to_vec();
    new_log.extend(fresh.iter().map(|&n| n as u32));
    if schedule == Schedule::Free {
        return Some(Plan {
            passes: split(schedule, start, end, tokens_per_block, prefill_batch),
            log: new_log,
        });
    }
    // Replay every logged pass from `start`, which must be a pass boundary.
    let mut passes = Vec::new();
    let mut at = 0usize;
    for &n in &new_log {
        let n = n as usize;
        if at >= start {
            passes.push(n);
        } else if at + n > start {
            return None;
        }
        at += n;
    }
    debug_assert_eq!(at, end);
    Some(Plan {
        passes,
        log: new_log,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_passes_stay_inside_blocks() {
        assert_eq!(split(Schedule::Replay, 5, 40, 16, 512), [11, 16, 8]);
        assert_eq!(split(Schedule::Replay, 0, 32, 16, 8), [8, 8, 8, 8]);
        assert_eq!(split(Schedule::Free, 5, 40, 16, 16), [12, 12, 11]);
        assert!(split(Schedule::Free, 7, 7, 16, 16).is_empty());
    }

    #[test]
    fn replay_restarts_only_on_block_aligned_pass_boundaries() {
        // A 20-token prompt (passes 16 + 4), 6 decoded tokens, then a 10-token turn.
        let log = [16, 4, 1, 1, 1, 1, 1, 1];
        let p = plan(Schedule::Replay, &log, 26, 16, 36, 16, 512).unwrap();
        assert_eq!(p.passes, [4, 1, 1, 1, 1, 1, 1, 6, 4]);
        assert_eq!(&p.log[8..], [6, 4]);
        assert_eq!(
            plan(Schedule::Replay, &log, 26, 0, 36, 16, 512)
                .unwrap()
                .passes
                .len(),
            10
        );
        assert_eq!(plan(Schedule::Replay, &log, 26, 18, 36, 16, 512), None);
        assert_eq!(
            plan(Schedule::Replay, &log, 26, 20, 36, 16, 512)
                .unwrap()
                .passes
                .len(),
            8
        );
        assert_eq!(
            plan(Schedule::Replay, &log, 26, 26, 36, 16, 512)
                .unwrap()
                .passes,
            [6, 4]
        );
        // Reuse beyond the log (the turn's own blocks, cached by an earlier failed attempt).
        assert_eq!(
            plan(Schedule::Replay, &log, 26, 32, 36, 16, 512)
                .unwrap()
                .passes,
            [4]
        );
        // A log that crosses a block boundary (written under the free schedule) cannot be
        // entered in the middle of that pass.
        assert_eq!(plan(Schedule::Replay, &[30], 30, 16, 36, 16, 512), None);
        let p = plan(Schedule::Free, &log, 26, 20, 36, 16, 512).unwrap();
        assert_eq!(p.passes, [16]);
    }
}
