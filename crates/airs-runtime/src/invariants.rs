//! Checks of the memory invariants of §6.3 and of the scheduler's preemption rule, written
//! independently of the code that enforces them, for tests and for `airs bench sessions` to
//! run while a workload runs: the pool budget is never exceeded, an active interactive session
//! or a running interactive request is never evicted, session caches go background → system →
//! idle interactive, least recently used first, and a running sequence is preempted only for
//! a more important one (or, among system or background sequences, the latest arrived gives
//! way).
//!
//! Cost: O(sessions) per event; a pool audit scans every block.

use std::time::Duration;

use airs_memory::eviction::Priority;
use airs_memory::{KvPool, KvPoolStats};

use crate::scheduler::SchedulerEvent;

/// The eviction level of a session cache at `at`: 0 background, 1 system, 2 idle interactive,
/// or `None` when it must not be evicted.
fn level(priority: Priority, last_access: Duration, at: Duration, idle: Duration) -> Option<u8> {
    match priority {
        Priority::Background => Some(0),
        Priority::System => Some(1),
        Priority::Interactive => (at.saturating_sub(last_access) > idle).then_some(2),
    }
}

/// Check one memory event; `Err` describes the violation.
pub fn check_event(e: &SchedulerEvent, idle_threshold: Duration) -> Result<(), String> {
    match e {
        SchedulerEvent::Preempted {
            victim,
            priority,
            requester,
            requester_priority,
            ..
        } => {
            if *priority == Priority::Interactive {
                return Err(format!("preempted interactive sequence {victim:?}"));
            }
            if priority < requester_priority {
                return Err(format!(
                    "preempted {victim:?} ({priority}) for the less important {requester:?} \
                     ({requester_priority})"
                ));
            }
            Ok(())
        }
        SchedulerEvent::CacheEvicted {
            at,
            session,
            priority,
            blocks_before,
            blocks_after,
            caches,
            ..
        } => {
            let victim = caches
                .iter()
                .find(|c| c.0 == *session)
                .ok_or_else(|| format!("evicted {session} which held no blocks"))?;
            let Some(v_level) = level(*priority, victim.2, *at, idle_threshold) else {
                return Err(format!(
                    "evicted active interactive session {session} (last used {:?} before, \
                     threshold {idle_threshold:?})",
                    at.saturating_sub(victim.2)
                ));
            };
            for other in caches.iter().filter(|c| c.0 != *session && c.3 > 0) {
                let Some(l) = level(other.1, other.2, *at, idle_threshold) else {
                    continue;
                };
                if l < v_level {
                    return Err(format!(
                        "evicted {session} ({priority}) while {} ({}) still held {} blocks",
                        other.0, other.1, other.3
                    ));
                }
                if l == v_level && (other.2, other.0) < (victim.2, victim.0) {
                    return Err(format!(
                        "evicted {session} before the less recently used {} of the same level",
                        other.0
                    ));
                }
            }
            if blocks_after >= blocks_before {
                return Err(format!(
                    "step on {session} kept {blocks_after} of {blocks_before} blocks"
                ));
            }
            Ok(())
        }
        SchedulerEvent::Exhausted(_) => Ok(()),
    }
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
