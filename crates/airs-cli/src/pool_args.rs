//! The model pool a command runs in: `--device-ram` and `--model-pool`, turned into the device
//! budget by the design's rule (`airs_memory::budget`, §6.1) and into the one account every
//! byte held for models is charged to (`airs_memory::ModelPool`), with the model registry that
//! loads weights into it. `airs fit` predicts with the same flags; `airs run`, `airs session`
//! and `airs bench sessions` enforce them.
//! Cost: reads `/proc/meminfo` once when `--device-ram` is not given.

use std::sync::Arc;

use airs_memory::{ModelRegistry, PoolBudget};
use anyhow::Context;

use crate::fit::parse_size;

/// `--device-ram`, `--model-pool`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PoolArgs {
    /// Total RAM of the device, e.g. 4G, 4096M, 8GiB (binary units: 4G = 4096 MiB); sets the
    /// model pool by the device rule [default: this machine's MemTotal rounded up to whole GiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub device_ram: Option<u64>,
    /// Model pool size, overriding the device rule (the user pool takes up the difference).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub model_pool: Option<u64>,
}

impl PoolArgs {
    /// The device budget and where its RAM size came from.
    pub fn budget(&self) -> anyhow::Result<(PoolBudget, &'static str)> {
        let (mut budget, source) = match self.device_ram {
            Some(bytes) => (PoolBudget::for_total_ram(bytes), "--device-ram"),
            None => (
                PoolBudget::for_this_device().context("reading this machine's RAM size")?,
                "this machine",
            ),
        };
        if let Some(pool) = self.model_pool {
            budget = budget.with_model_pool(pool)?;
        }
        Ok((budget, source))
    }

    /// An empty model registry over a new account of the budget's model pool. A device without
    /// a model pool (2 GB: inference is remote) is an error here, before anything is loaded.
    pub fn registry(&self) -> anyhow::Result<Arc<ModelRegistry>> {
        let (budget, source) = self.budget()?;
        anyhow::ensure!(
            budget.model_pool_bytes > 0,
            "a device with {} MiB of RAM ({source}) has no model pool: the design routes its \
             inference to a remote endpoint (give --model-pool SIZE to run locally anyway)",
            budget.total_bytes >> 20
        );
        Ok(Arc::new(ModelRegistry::for_budget(&budget)))
    }
}

/// The account's state for `--json` output.
pub fn model_pool_json(pool: &airs_memory::ModelPool) -> serde_json::Value {
    let u = pool.usage();
    serde_json::json!({
        "capacity_bytes": u.capacity_bytes,
        "weights_bytes": u.weights_bytes,
        "kv_cache_bytes": u.kv_cache_bytes,
        "scratch_bytes": u.scratch_bytes,
        "free_bytes": u.free_bytes(),
    })
}
