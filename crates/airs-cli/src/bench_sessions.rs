//! `airs bench sessions`: a scripted mix of interactive, system and background sessions served
//! from a KV pool too small for all of them (`--pool`), reporting evictions per priority,
//! preemptions, rebuilt tokens, with the §6.3 invariants checked after every scheduler step
//! (pool budget never exceeded, no active interactive session or running interactive request
//! evicted, order background → system → idle interactive). `--verify` also serves the workload from a pool that never
//! evicts and requires every reply to be identical. The workload is a preset (`mixed`) or a
//! JSON file; its format is documented in `airs_runtime::workload`.
//!
//! The weights, the KV pool and the scratch are charged to one model pool (`--device-ram`,
//! `--model-pool`); the report shows the account.
//!
//! Time is simulated (a manual clock advanced per workload step), so idleness costs no waiting;
//! histories are kept in an in-memory database. Exits with an error if an invariant broke or a
//! verified reply differed. Cost: the workload's forward passes (twice with `--verify`).

use std::path::PathBuf;
use std::sync::Arc;

use airs_engine::KvType;
use airs_runtime::LoadedModel;
use airs_runtime::workload::{BenchConfig, Workload, run_bench};
use anyhow::Context;

use crate::model_file::{LoaderArgs, default_threads, load};
use crate::pool_args::PoolArgs;
use crate::session_cmd::parse_size;

#[derive(clap::Args, Debug)]
pub struct BenchSessionsArgs {
    /// The GGUF model.
    #[arg(long)]
    pub model: PathBuf,
    /// KV pool budget (e.g. 384K, 8M), taken from the model pool with the weights and scratch.
    #[arg(long, value_parser = parse_size)]
    pub pool: usize,
    #[command(flatten)]
    pub model_pool: PoolArgs,
    /// A preset (mixed) or a workload JSON file.
    #[arg(long, default_value = "mixed")]
    pub workload: String,
    /// Also run with a pool that never evicts and compare every reply.
    #[arg(long)]
    pub verify: bool,
    /// Positions per KV block.
    #[arg(long, default_value_t = airs_memory::DEFAULT_TOKENS_PER_BLOCK)]
    pub tokens_per_block: u32,
    /// KV cache element type.
    #[arg(long, default_value = "f16")]
    pub kv_type: KvType,
    #[command(flatten)]
    pub load: LoaderArgs,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: BenchSessionsArgs) -> anyhow::Result<()> {
    let workload = Workload::load(&args.workload)?;
    let threads = args.threads.unwrap_or_else(default_threads);
    // The measured scheduler runs in the model pool; the never-evicting reference is an oracle
    // with an account of its own.
    let registry = args.model_pool.registry()?;
    let model = Arc::new(load(Some(&args.model), &args.load, &registry, threads)?);
    let reference = if args.verify {
        Some(Arc::new(
            LoadedModel::open(&args.model, threads)
                .with_context(|| format!("opening {}", args.model.display()))?,
        ))
    } else {
        None
    };
    let mut config = BenchConfig::new(args.pool);
    config.tokens_per_block = args.tokens_per_block;
    config.kv_type = args.kv_type;
    config.verify = args.verify;
    let report = run_bench(&model, reference.as_ref(), &config, &workload)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    anyhow::ensure!(
        report.ok(),
        "invariant violations or differing replies (see the report)"
    );
    Ok(())
}
