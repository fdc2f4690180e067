//! `--device-ram` and `--model-pool`: the model pool a command runs in, turned into the
//! runtime's [`PoolPolicy`] (the design's budget rule, `airs_runtime::fit`). `airs fit`
//! predicts with the same flags; every command that runs a model enforces them.

use std::sync::Arc;

use airs_memory::ModelRegistry;
use airs_runtime::fit::{PoolPolicy, parse_size};

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
    pub fn policy(&self) -> PoolPolicy {
        PoolPolicy {
            device_ram: self.device_ram,
            model_pool: self.model_pool,
        }
    }

    /// An empty model registry over the model pool (an error on a device without one).
    pub fn registry(&self) -> anyhow::Result<Arc<ModelRegistry>> {
        Ok(self.policy().registry()?)
    }
}

/// The account's state for `--json` output.
pub fn model_pool_json(pool: &airs_memory::ModelPool) -> serde_json::Value {
    serde_json::to_value(airs_runtime::service::ModelPoolUsage::from(pool.usage()))
        .unwrap_or_default()
}
