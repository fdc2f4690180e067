//! The model pool's one account: every byte airs holds for models — weight regions, KV-cache
//! blocks, forward-pass scratch — is charged here before it is allocated, so the pool's budget
//! is enforced at run time rather than only predicted by `airs fit`.
//!
//! Design: §6.1 of the model-memory chapter splits the device's RAM into pools and gives the
//! model pool to "model weights and KV caches"; the design README adds that nothing airs holds
//! for models lives outside it unaccounted. The account is that budget as a value:
//! [`ModelPool::charge`] either takes bytes from the pool or refuses with a [`PoolFull`] that
//! names everything holding the memory; the returned [`PoolCharge`] gives the bytes back when it
//! is dropped (RAII), so an owner that goes away — an evicted model, a dropped KV pool —
//! cannot leak its share. The [`crate::ModelRegistry`] charges each model's region, the
//! [`crate::KvPool`] its mapping ([`crate::KvPool::new_charged`]), the runtime its scratch.
//!
//! A charge is taken *before* the memory is mapped, so the pool is never over-committed, not
//! even transiently. Charges are exact byte counts of what the owner maps (a region's file image
//! rounded to the base page, a KV pool's whole blocks) or, for scratch, the engine's upper bound
//! for one forward pass.
//!
//! Cost: `charge` and dropping a charge are O(charges) under one mutex (a handful of charges per
//! loaded model); nothing is per token or per block.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::registry::List;

/// What a charge pays for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolUse {
    /// A model's weight region.
    Weights,
    /// A paged KV-cache pool.
    KvCache,
    /// Activation buffers of forward passes.
    Scratch,
}

impl PoolUse {
    pub fn name(self) -> &'static str {
        match self {
            PoolUse::Weights => "weights",
            PoolUse::KvCache => "KV cache",
            PoolUse::Scratch => "scratch",
        }
    }
}

impl fmt::Display for PoolUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One live charge, as reported by [`ModelPool::holders`] and in [`PoolFull`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeInfo {
    pub usage: PoolUse,
    /// Who holds it (a model path, "KV pool of …", …).
    pub label: String,
    pub bytes: u64,
}

impl fmt::Display for ChargeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} ({})", self.usage, self.label, Bytes(self.bytes))
    }
}

/// Bytes in the pool at one instant, by use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolUsage {
    pub capacity_bytes: u64,
    pub weights_bytes: u64,
    pub kv_cache_bytes: u64,
    pub scratch_bytes: u64,
}

impl PoolUsage {
    pub fn used_bytes(&self) -> u64 {
        self.weights_bytes + self.kv_cache_bytes + self.scratch_bytes
    }

    pub fn free_bytes(&self) -> u64 {
        self.capacity_bytes.saturating_sub(self.used_bytes())
    }
}

/// A charge the pool refused: taking `requested_bytes` would exceed the pool. Nothing was
/// charged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the model pool ({}) cannot hold {} of {} for {}: {} free; held by {}",
    Bytes(*capacity_bytes),
    Bytes(*requested_bytes),
    usage,
    label,
    Bytes(*free_bytes),
    List(holders)
)]
pub struct PoolFull {
    pub usage: PoolUse,
    pub label: String,
    pub requested_bytes: u64,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    /// Every charge holding the pool's memory, largest first.
    pub holders: Vec<ChargeInfo>,
}

/// The model pool's account (see the module documentation). Shared as `Arc<ModelPool>`.
#[derive(Debug)]
pub struct ModelPool {
    capacity_bytes: u64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Live charges by id (few: a linear scan is the right structure).
    charges: Vec<(u64, ChargeInfo)>,
    used_bytes: u64,
    next_id: u64,
}

impl ModelPool {
    /// An empty pool of `capacity_bytes`.
    pub fn new(capacity_bytes: u64) -> Arc<ModelPool> {
        Arc::new(ModelPool {
            capacity_bytes,
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every statement leaves the state consistent; a panic elsewhere cannot break it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    pub fn used_bytes(&self) -> u64 {
        self.lock().used_bytes
    }

    pub fn free_bytes(&self) -> u64 {
        self.capacity_bytes - self.used_bytes()
    }

    /// Takes `bytes` for `usage` on behalf of `label`, or refuses if the pool would overflow.
    pub fn charge(
        self: &Arc<Self>,
        usage: PoolUse,
        bytes: u64,
        label: impl Into<String>,
    ) -> Result<PoolCharge, PoolFull> {
        let label = label.into();
        let mut st = self.lock();
        let free_bytes = self.capacity_bytes - st.used_bytes;
        if bytes > free_bytes {
            let mut holders: Vec<ChargeInfo> = st.charges.iter().map(|(_, c)| c.clone()).collect();
            holders.sort_by_key(|c| std::cmp::Reverse(c.bytes));
            return Err(PoolFull {
                usage,
                label,
                requested_bytes: bytes,
                capacity_bytes: self.capacity_bytes,
                free_bytes,
                holders,
            });
        }
        let id = st.next_id;
        st.next_id += 1;
        st.used_bytes += bytes;
        st.charges.push((
            id,
            ChargeInfo {
                usage,
                label,
                bytes,
            },
        ));
        Ok(PoolCharge {
            pool: self.clone(),
            id,
            usage,
            bytes,
        })
    }

    /// Every live charge, largest first.
    pub fn holders(&self) -> Vec<ChargeInfo> {
        let mut v: Vec<ChargeInfo> = self.lock().charges.iter().map(|(_, c)| c.clone()).collect();
        v.sort_by_key(|c| std::cmp::Reverse(c.bytes));
        v
    }

    /// Bytes charged, by use.
    pub fn usage(&self) -> PoolUsage {
        let st = self.lock();
        let mut u = PoolUsage {
            capacity_bytes: self.capacity_bytes,
            ..PoolUsage::default()
        };
        for (_, c) in &st.charges {
            match c.usage {
                PoolUse::Weights => u.weights_bytes += c.bytes,
                PoolUse::KvCache => u.kv_cache_bytes += c.bytes,
                PoolUse::Scratch => u.scratch_bytes += c.bytes,
            }
        }
        u
    }

    fn release(&self, id: u64) {
        let mut st = self.lock();
        if let Some(i) = st.charges.iter().position(|(c, _)| *c == id) {
            let (_, c) = st.charges.swap_remove(i);
            st.used_bytes -= c.bytes;
        }
    }
}

/// Bytes taken from a [`ModelPool`]; given back when dropped.
#[derive(Debug)]
pub struct PoolCharge {
    pool: Arc<ModelPool>,
    id: u64,
    usage: PoolUse,
    bytes: u64,
}

impl PoolCharge {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn usage(&self) -> PoolUse {
        self.usage
    }

    /// The pool charged.
    pub fn pool(&self) -> &Arc<ModelPool> {
        &self.pool
    }
}

impl Drop for PoolCharge {
    fn drop(&mut self) {
        self.pool.release(self.id);
    }
}

/// Bytes as MiB with one decimal (exact bytes below 1 MiB).
struct Bytes(u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 < 1 << 20 {
            write!(f, "{} bytes", self.0)
        } else {
            write!(f, "{:.1} MiB", self.0 as f64 / (1u64 << 20) as f64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_are_returned_when_dropped() {
        let pool = ModelPool::new(100);
        let w = pool.charge(PoolUse::Weights, 60, "m.gguf").unwrap();
        let kv = pool.charge(PoolUse::KvCache, 30, "kv").unwrap();
        assert_eq!(pool.used_bytes(), 90);
        let u = pool.usage();
        assert_eq!(
            (u.weights_bytes, u.kv_cache_bytes, u.free_bytes()),
            (60, 30, 10)
        );
        drop(w);
        assert_eq!(pool.used_bytes(), 30);
        drop(kv);
        assert_eq!(pool.used_bytes(), 0);
    }

    #[test]
    fn a_refused_charge_names_the_holders_and_takes_nothing() {
        let pool = ModelPool::new(3 << 20);
        let _w = pool.charge(PoolUse::Weights, 2 << 20, "a.gguf").unwrap();
        let _s = pool.charge(PoolUse::Scratch, 1000, "forward pass").unwrap();
        let e = pool
            .charge(PoolUse::KvCache, 1 << 20, "KV pool")
            .unwrap_err();
        assert_eq!(e.free_bytes, (1 << 20) - 1000);
        assert_eq!(pool.used_bytes(), (2 << 20) + 1000);
        assert_eq!(
            e.to_string(),
            "the model pool (3.0 MiB) cannot hold 1.0 MiB of KV cache for KV pool: 1047576 \
             bytes free; held by weights a.gguf (2.0 MiB), scratch forward pass (1000 bytes)"
        );
    }

    #[test]
    fn the_pool_is_never_exceeded_under_concurrent_charges() {
        let pool = ModelPool::new(1000);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    for i in 0..2000u64 {
                        if let Ok(c) = pool.charge(PoolUse::KvCache, 1 + (i * 7 + t) % 97, "t") {
                            held.push(c);
                        }
                        assert!(pool.used_bytes() <= 1000);
                        if i % 3 == 0 {
                            held.pop();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(pool.used_bytes(), 0);
    }
}
