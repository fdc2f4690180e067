//! Device memory budget: how a device's RAM splits into kernel, reserved, DMA, user and model
//! pools, and what a KV cache costs per token.
//!
//! Design: §6.1 and §6.3 of the model-memory chapter (pool table per device tier; "2 GB → model
//! pool 0, all 1.75 GB after kernel/DMA/reserved is user pool"). The kernel-side pools are
//! modelled as byte budgets (design README, "Scope"). The rule, which reproduces the chapter's
//! table:
//! - kernel + reserved + DMA = min(RAM / 8, 512 MiB), split 2 : 1 : 1
//!   (4 GiB → 256 + 128 + 128 MiB; 2 GiB → 128 + 64 + 64 MiB);
//! - model pool = RAM / 2 when RAM ≥ 3 GiB, else 0 (inference is remote);
//! - user pool = the rest (4 GiB → 1536 MiB, 8 GiB → 3584 MiB, 2 GiB → 1792 MiB).
//!
//! `MemTotal` is below the nominal size (firmware and kernel image are not counted), so
//! [`PoolBudget::for_this_device`] rounds it up to whole GiB before applying the rule.
//! Cost: pure arithmetic; reading `/proc/meminfo` once.

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Byte budgets of a device's memory pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolBudget {
    pub total_bytes: u64,
    pub kernel_bytes: u64,
    pub reserved_bytes: u64,
    pub dma_bytes: u64,
    pub user_pool_bytes: u64,
    pub model_pool_bytes: u64,
}

impl PoolBudget {
    /// Applies the rule (module docs) to `total_bytes` of RAM.
    pub fn for_total_ram(total_bytes: u64) -> Self {
        let fixed = (total_bytes / 8).min(512 * MIB);
        let kernel_bytes = fixed / 2;
        let reserved_bytes = fixed / 4;
        let dma_bytes = fixed - kernel_bytes - reserved_bytes;
        let model_pool_bytes = if total_bytes >= 3 * GIB {
            total_bytes / 2
        } else {
            0
        };
        Self {
            total_bytes,
            kernel_bytes,
            reserved_bytes,
            dma_bytes,
            user_pool_bytes: total_bytes - fixed - model_pool_bytes,
            model_pool_bytes,
        }
    }

    /// The budget of this machine: `MemTotal` rounded up to whole GiB, then the rule.
    pub fn for_this_device() -> std::io::Result<Self> {
        Ok(Self::for_total_ram(read_total_ram()?.div_ceil(GIB) * GIB))
    }

    /// Whether a model of `model_bytes` plus `kv_bytes` of KV cache fits the model pool.
    pub fn fits(&self, model_bytes: u64, kv_bytes: u64) -> bool {
        model_bytes.saturating_add(kv_bytes) <= self.model_pool_bytes
    }
}

/// `MemTotal` from `/proc/meminfo`, in bytes.
pub fn read_total_ram() -> std::io::Result<u64> {
    parse_mem_total(&std::fs::read_to_string("/proc/meminfo")?).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "no MemTotal in /proc/meminfo",
        )
    })
}

fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// KV-cache bytes per token: 2 (K and V) × layers × head_dim × kv_heads × bytes per element.
pub fn kv_bytes_per_token(layers: u32, head_dim: u32, kv_heads: u32, dtype_bytes: u32) -> u64 {
    2 * u64::from(layers) * u64::from(head_dim) * u64::from(kv_heads) * u64::from(dtype_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_gib_matches_the_design_table() {
        let b = PoolBudget::for_total_ram(4 * GIB);
        assert_eq!(b.kernel_bytes, 256 * MIB);
        assert_eq!(b.reserved_bytes, 128 * MIB);
        assert_eq!(b.dma_bytes, 128 * MIB);
        assert_eq!(b.user_pool_bytes, 1536 * MIB);
        assert_eq!(b.model_pool_bytes, 2048 * MIB);
    }

    #[test]
    fn eight_gib_has_a_4_gib_model_pool() {
        let b = PoolBudget::for_total_ram(8 * GIB);
        assert_eq!(b.model_pool_bytes, 4096 * MIB);
        assert_eq!(b.kernel_bytes + b.reserved_bytes + b.dma_bytes, 512 * MIB);
        assert_eq!(b.user_pool_bytes, 3584 * MIB);
    }

    #[test]
    fn two_gib_has_no_model_pool() {
        let b = PoolBudget::for_total_ram(2 * GIB);
        assert_eq!(b.model_pool_bytes, 0);
        assert_eq!(b.user_pool_bytes, 1792 * MIB); // the chapter's "1.75 GB"
        assert!(!b.fits(700 * MIB, 0));
    }

    #[test]
    fn pools_always_add_up() {
        for gib in 1..=16 {
            let b = PoolBudget::for_total_ram(gib * GIB);
            let sum = b.kernel_bytes
                + b.reserved_bytes
                + b.dma_bytes
                + b.user_pool_bytes
                + b.model_pool_bytes;
            assert_eq!(sum, b.total_bytes);
        }
    }

    #[test]
    fn kv_per_token_matches_llama_8b_q8() {
        // §6.3: 32 layers × 8 KV heads × 128 head_dim, Q8 → 64 KB per token.
        assert_eq!(kv_bytes_per_token(32, 128, 8, 1), 64 * 1024);
        let b = PoolBudget::for_total_ram(4 * GIB);
        assert!(b.fits(700 * MIB, 2048 * kv_bytes_per_token(22, 64, 4, 2)));
    }

    #[test]
    fn meminfo_parses_and_this_device_has_ram() {
        assert_eq!(
            parse_mem_total("MemTotal:        3884 kB\nMemFree: 1 kB\n"),
            Some(3884 * 1024)
        );
        assert!(read_total_ram().unwrap() > 0);
        assert!(PoolBudget::for_this_device().unwrap().total_bytes >= GIB);
    }
}
