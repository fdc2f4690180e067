//! `airs bench host`: what the machine gives the benchmark threads right now, to say which
//! placement a measurement ran under (`airs_engine::cores`). One thread's and all threads'
//! int8 dot rate and read bandwidth, and their ratios: on the 2-vCPU benchmark host, 2 cores'
//! worth of the dot instruction unless the vCPUs share a core, and 2× one thread's read
//! bandwidth or only 1.1× as the host places them (`airs_engine::cores`); and how long a cache
//! line takes to go from one thread to the other and back (60-90 ns on one chiplet, 330-360 ns
//! across two).
//! `scripts/peer-bench.sh` runs it before and after every engine's run.
//!
//! Cost: about half a second with the defaults (`airs_engine::cores`).

use airs_engine::{ThreadPool, probe_core_share};
use airs_kernels::Isa;
use serde_json::json;

use crate::model_file::default_threads;

#[derive(clap::Args, Debug)]
pub struct BenchHostArgs {
    /// Threads probed together (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Milliseconds per pass of the int8 dot probe.
    #[arg(long, default_value_t = 20)]
    pub pass_ms: u64,
    /// Bytes read per pass of the read probe, in MiB (far above the last-level cache).
    #[arg(long, default_value_t = 256)]
    pub read_mib: usize,
    /// Passes of each probe; medians are reported.
    #[arg(long, default_value_t = 5)]
    pub passes: usize,
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: BenchHostArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.passes > 0 && args.pass_ms > 0,
        "--passes and --pass-ms must be positive"
    );
    anyhow::ensure!(args.read_mib > 0, "--read-mib must be positive");
    let threads = args.threads.unwrap_or_else(default_threads).max(1);
    let pool = ThreadPool::new(threads);
    let isa = Isa::detect();
    let share = probe_core_share(&pool, isa, args.pass_ms, args.read_mib << 20, args.passes);
    if args.json {
        let out = json!({
            "threads": share.threads,
            "isa": format!("{isa:?}"),
            "int8_dot_macs_per_s": {"one_thread": share.dot_one_macs_per_s, "all_threads": share.dot_all_macs_per_s},
            "read_bytes_per_s": {"one_thread": share.read_one_bytes_per_s, "all_threads": share.read_all_bytes_per_s},
            "dot_cores": share.dot_cores(),
            "read_scaling": share.read_scaling(),
            "multipliers": share.multipliers().name(),
            "read_path": share.read_path().name(),
            "cache_line_round_trip_ns": share.round_trip_ns,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{threads} threads ({isa:?}), medians of {} passes",
        args.passes
    );
    println!(
        "  int8 dot   one thread {:7.1} G MAC/s   all {:7.1}   → {:.2} cores' worth: {} multipliers",
        share.dot_one_macs_per_s / 1e9,
        share.dot_all_macs_per_s / 1e9,
        share.dot_cores(),
        share.multipliers().name()
    );
    println!(
        "  read       one thread {:7.1} GB/s      all {:7.1}   → {:.2}× one thread: {} read path",
        share.read_one_bytes_per_s / 1e9,
        share.read_all_bytes_per_s / 1e9,
        share.read_scaling(),
        share.read_path().name()
    );
    if let Some(ns) = share.round_trip_ns {
        println!("  hand-off   a cache line from thread 0 to thread 1 and back: {ns:.0} ns");
    }
    Ok(())
}
