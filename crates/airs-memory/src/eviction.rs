//! KV-cache eviction policy: given what every session's cache holds, in which order to take
//! blocks back when a request needs more than the pool has free — a pure function of session
//! descriptors, the current time and the idle threshold, with no knowledge of pools, tables or
//! models (the runtime applies the order it returns; see `airs-runtime`).
//!
//! Design: §6.3 of the model-memory chapter gives every KV cache a `CachePriority`
//! (`Interactive`, `System`, `Background`) and a last-use time, and evicts in that order of
//! priority, least recently used first, partially filled blocks first (they hold the fewest
//! positions, so they cost the least to recompute). The design README reads "eviction" as
//! returning blocks to the pool's free list and recomputing them later from the persisted
//! conversation, never paging — as vLLM does when it preempts a sequence by recomputation
//! (Kwon et al., SOSP 2023), and SGLang when it evicts radix-tree leaves (Zheng et al., 2024):
//! the end of a sequence goes first, so what survives is still a usable prefix.
//!
//! The order, exactly:
//! 1. **Levels**: every background session, then every system session, then every interactive
//!    session idle for *longer* than the idle threshold ([`EvictionClass`]). An interactive
//!    session used within the threshold is *active* and never evicted; neither is any session
//!    that is in the middle of a request (the descriptor's `in_request` flag). Sessions holding
//!    no block are skipped.
//! 2. **Within a level**: least recently used first (`last_access` ascending, then id).
//! 3. **Within a session**: truncate from the end. The first step frees everything past the
//!    session's last *full* block — its partially filled last block and any block reserved but
//!    not yet written — then each further step frees one full block, last first, down to none.
//!    A session is emptied before the next session is touched.
//!
//! Steps are cumulative: applying step `i` means applying every earlier step too, and the
//! runtime stops as soon as the pool can serve the request. A step's `freed_blocks` counts the
//! session's *references*; a block shared with another session (a common prompt prefix) returns
//! to the free list only when its last holder lets go, which the pool's refcounts decide.
//!
//! Cost: O(s log s + b) for `s` sessions holding `b` blocks in all (one sort, one step per
//! block); no allocation beyond the returned plan.

use std::fmt;
use std::time::Duration;

/// A session's identity, as the runtime numbers them.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Who is waiting on a session's cache (§6.3 `CachePriority`), most important first.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Priority {
    /// A user is waiting (the conversation bar).
    Interactive,
    /// A system service (intent verification, the context engine).
    System,
    /// Background work (indexing).
    Background,
}

impl Priority {
    pub const ALL: [Priority; 3] = [
        Priority::Interactive,
        Priority::System,
        Priority::Background,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Priority::Interactive => "interactive",
            Priority::System => "system",
            Priority::Background => "background",
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Priority {
    type Err = String;

    fn from_str(s: &str) -> Result<Priority, String> {
        match s {
            "interactive" => Ok(Priority::Interactive),
            "system" => Ok(Priority::System),
            "background" => Ok(Priority::Background),
            other => Err(format!(
                "unknown priority {other:?} (interactive, system or background)"
            )),
        }
    }
}

/// The eviction level a session falls in, in eviction order.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EvictionClass {
    Background,
    System,
    /// An interactive session idle for longer than the threshold.
    IdleInteractive,
}

impl EvictionClass {
    pub fn name(self) -> &'static str {
        match self {
            EvictionClass::Background => "background",
            EvictionClass::System => "system",
            EvictionClass::IdleInteractive => "idle_interactive",
        }
    }
}

impl fmt::Display for EvictionClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a session may not be evicted.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Protection {
    /// The session is being served (its cache is in use).
    InRequest,
    /// An interactive session used within the idle threshold.
    ActiveInteractive {
        /// Time since its last KV access.
        idle_for: Duration,
    },
}

impl fmt::Display for Protection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Protection::InRequest => f.write_str("in request"),
            Protection::ActiveInteractive { idle_for } => {
                write!(f, "active, last used {:.1} s ago", idle_for.as_secs_f64())
            }
        }
    }
}

/// What the policy needs to know about one session's cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionDescriptor {
    pub id: SessionId,
    pub priority: Priority,
    /// Time of the session's last KV access (any monotonic clock, the same as `now`'s).
    pub last_access: Duration,
    /// The session is in the middle of a request: never evicted, whatever its priority.
    pub in_request: bool,
    /// Blocks the session's block table references (shared ones included).
    pub blocks_held: u32,
    /// Leading blocks holding `tokens_per_block` committed positions each.
    pub full_blocks: u32,
    /// Committed positions in the block after the full ones (0 when there is none).
    pub partial_block_tokens: u32,
}

/// The policy's parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictionPolicy {
    /// An interactive session idle for longer than this may be evicted.
    pub idle_threshold: Duration,
    /// Positions per full block (to report recomputation cost).
    pub tokens_per_block: u32,
}

impl EvictionPolicy {
    /// Five minutes, the default idle threshold.
    pub const DEFAULT_IDLE_THRESHOLD: Duration = Duration::from_secs(300);

    pub fn new(tokens_per_block: u32) -> EvictionPolicy {
        EvictionPolicy {
            idle_threshold: Self::DEFAULT_IDLE_THRESHOLD,
            tokens_per_block,
        }
    }

    /// The level `d` is evicted at, or why it is protected.
    pub fn classify(
        &self,
        d: &SessionDescriptor,
        now: Duration,
    ) -> Result<EvictionClass, Protection> {
        if d.in_request {
            return Err(Protection::InRequest);
        }
        match d.priority {
            Priority::Background => Ok(EvictionClass::Background),
            Priority::System => Ok(EvictionClass::System),
            Priority::Interactive => {
                let idle_for = now.saturating_sub(d.last_access);
                if idle_for > self.idle_threshold {
                    Ok(EvictionClass::IdleInteractive)
                } else {
                    Err(Protection::ActiveInteractive { idle_for })
                }
            }
        }
    }

    /// The eviction order over `sessions` at time `now` (see the module documentation).
    pub fn plan(&self, sessions: &[SessionDescriptor], now: Duration) -> EvictionPlan {
        let mut victims = Vec::new();
        let mut protected = Vec::new();
        for d in sessions.iter().filter(|d| d.blocks_held > 0) {
            match self.classify(d, now) {
                Ok(class) => victims.push((class, d)),
                Err(why) => protected.push((d.id, why)),
            }
        }
        victims.sort_by_key(|(class, d)| (*class, d.last_access, d.id));
        let tpb = u64::from(self.tokens_per_block);
        let mut steps = Vec::new();
        for (class, d) in victims {
            let full = d.full_blocks.min(d.blocks_held);
            if d.blocks_held > full {
                steps.push(EvictionStep {
                    session: d.id,
                    class,
                    keep_blocks: full,
                    freed_blocks: d.blocks_held - full,
                    recompute_tokens: u64::from(d.partial_block_tokens),
                });
            }
            for keep in (0..full).rev() {
                steps.push(EvictionStep {
                    session: d.id,
                    class,
                    keep_blocks: keep,
                    freed_blocks: 1,
                    recompute_tokens: tpb,
                });
            }
        }
        EvictionPlan { steps, protected }
    }
}

/// One step of an eviction order: truncate `session`'s cache to its first `keep_blocks` blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictionStep {
    pub session: SessionId,
    pub class: EvictionClass,
    /// Blocks the session keeps after this step (a prefix of its block table).
    pub keep_blocks: u32,
    /// Block references this step drops.
    pub freed_blocks: u32,
    /// Positions this step adds to the session's recomputation on its next request.
    pub recompute_tokens: u64,
}

/// The eviction order, and the sessions that hold blocks but may not be evicted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EvictionPlan {
    pub steps: Vec<EvictionStep>,
    pub protected: Vec<(SessionId, Protection)>,
}

impl EvictionPlan {
    /// Block references the whole plan drops.
    pub fn evictable_blocks(&self) -> u64 {
        self.steps.iter().map(|s| u64::from(s.freed_blocks)).sum()
    }

    /// The shortest prefix of the steps that drops at least `blocks` references (all of them
    /// if the plan cannot).
    pub fn prefix_for(&self, blocks: u64) -> &[EvictionStep] {
        let mut freed = 0;
        for (i, s) in self.steps.iter().enumerate() {
            if freed >= blocks {
                return &self.steps[..i];
            }
            freed += u64::from(s.freed_blocks);
        }
        &self.steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(
        id: u64,
        priority: Priority,
        last: u64,
        blocks: u32,
        full: u32,
        partial: u32,
    ) -> SessionDescriptor {
        SessionDescriptor {
            id: SessionId(id),
            priority,
            last_access: Duration::from_secs(last),
            in_request: false,
            blocks_held: blocks,
            full_blocks: full,
            partial_block_tokens: partial,
        }
    }

    #[test]
    fn sessions_are_truncated_from_the_end_in_level_then_lru_order() {
        let p = EvictionPolicy::new(16);
        let now = Duration::from_secs(1000);
        let plan = p.plan(
            &[
                d(1, Priority::Interactive, 100, 2, 2, 0),
                d(2, Priority::System, 900, 1, 0, 5),
                d(3, Priority::Background, 950, 3, 2, 7),
                d(4, Priority::Interactive, 990, 4, 4, 0),
            ],
            now,
        );
        let got: Vec<(u64, u32)> = plan
            .steps
            .iter()
            .map(|s| (s.session.0, s.keep_blocks))
            .collect();
        assert_eq!(got, [(3, 2), (3, 1), (3, 0), (2, 0), (1, 1), (1, 0)]);
        assert_eq!(plan.steps[0].recompute_tokens, 7);
        assert_eq!(plan.protected.len(), 1);
        assert!(matches!(
            plan.protected[0].1,
            Protection::ActiveInteractive { .. }
        ));
        assert_eq!(plan.prefix_for(2).len(), 2);
        assert_eq!(plan.evictable_blocks(), 6);
    }
}
