//! Checks of the eviction invariants of §6.3, written independently of the policy that
//! enforces them, for tests and for `airs bench sessions` to run while a workload runs:
//! the pool budget is never exceeded, an active interactive session (or any session in the
//! middle of a request) is never evicted, and evictions go background → system → idle
//! interactive, least recently used first within a level.
//!
//! Cost: O(sessions) per eviction event; a pool audit scans every block.

use std::time::Duration;

use airs_memory::eviction::Priority;
use airs_memory::{KvPool, KvPoolStats};

use crate::manager::{EvictionEvent, SessionSnapshot};

/// The eviction level of a snapshot at `at`: 0 background, 1 system, 2 idle interactive, or
/// `None` when it must not be evicted.
fn level(s: &SessionSnapshot, at: Duration, idle_threshold: Duration) -> Option<u8> {
    if s.in_request {
        return None;
    }
    match s.priority {
        Priority::Background => Some(0),
        Priority::System => Some(1),
        Priority::Interactive => (at.saturating_sub(s.last_access) > idle_threshold).then_some(2),
    }
}

/// Check one applied eviction step; `Err` describes the violation.
pub fn check_eviction(e: &EvictionEvent, idle_threshold: Duration) -> Result<(), String> {
    let victim = e
        .snapshot
        .iter()
        .find(|s| s.id == e.step.session)
        .ok_or_else(|| format!("evicted {} which held no blocks", e.step.session))?;
    if victim.in_request {
        return Err(format!(
            "evicted {} in the middle of its request",
            victim.id
        ));
    }
    if victim.priority == Priority::Interactive
        && e.at.saturating_sub(victim.last_access) <= idle_threshold
    {
        return Err(format!(
            "evicted active interactive session {} (last used {:?} before, threshold {:?})",
            victim.id,
            e.at.saturating_sub(victim.last_access),
            idle_threshold
        ));
    }
    let Some(v_level) = level(victim, e.at, idle_threshold) else {
        return Err(format!("evicted protected session {}", victim.id));
    };
    for other in e
        .snapshot
        .iter()
        .filter(|s| s.id != victim.id && s.blocks_held > 0)
    {
        let Some(l) = level(other, e.at, idle_threshold) else {
            continue;
        };
        if l < v_level {
            return Err(format!(
                "evicted {} ({}) while {} ({}) still held {} blocks",
                victim.id, victim.priority, other.id, other.priority, other.blocks_held
            ));
        }
        if l == v_level && (other.last_access, other.id) < (victim.last_access, victim.id) {
            return Err(format!(
                "evicted {} before the less recently used {} of the same level",
                victim.id, other.id
            ));
        }
    }
    if e.blocks_after >= e.blocks_before || e.blocks_after > e.step.keep_blocks {
        return Err(format!(
            "step on {} kept {} of {} blocks (planned {})",
            victim.id, e.blocks_after, e.blocks_before, e.step.keep_blocks
        ));
    }
    if e.cached_tokens_after > e.cached_tokens_before {
        return Err(format!("step on {} grew its cache", victim.id));
    }
    Ok(())
}

/// Audit the pool and check that it holds its budget.
pub fn check_pool(pool: &KvPool) -> Result<KvPoolStats, String> {
    let s = pool.audit()?;
    let mapped = s.blocks_total as usize * s.block_bytes;
    if mapped > s.pool_bytes || s.used_bytes + s.cached_bytes > s.pool_bytes {
        return Err(format!(
            "pool over budget: {mapped} bytes mapped, {} used, {} cached, budget {}",
            s.used_bytes, s.cached_bytes, s.pool_bytes
        ));
    }
    Ok(s)
}

/// The model pool's account holds no more than its capacity, and the weights, KV pools and
/// scratch it lists add up to what it says is used.
pub fn check_model_pool(pool: &airs_memory::ModelPool) -> Result<(), String> {
    let u = pool.usage();
    if u.used_bytes() > u.capacity_bytes || u.used_bytes() != pool.used_bytes() {
        return Err(format!(
            "model pool over budget or inconsistent: weights {} + KV {} + scratch {} of {} \
             (account says {} used)",
            u.weights_bytes,
            u.kv_cache_bytes,
            u.scratch_bytes,
            u.capacity_bytes,
            pool.used_bytes()
        ));
    }
    Ok(())
}
