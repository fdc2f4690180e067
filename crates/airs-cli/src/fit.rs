//! `airs fit MODEL`: will this model run on this device? Splits the device's RAM into pools as
//! the design does (§6.1 of `shared/design/model-memory.md`), estimates what the model needs in
//! the model pool — the weights, the paged KV cache of `--sessions` × `--context` tokens and the
//! scratch of a step — with the runtime's own estimate (`airs_runtime::fit`, the same numbers
//! the scheduler charges before it allocates), gives a verdict (fits, does not fit, or fits
//! with at most K sessions or C tokens per session), and adds the runtime overhead outside the
//! model pool to predict the peak resident set of `airs run`. See `airs_runtime::fit` for what
//! each part counts.
//!
//! Predicted peak RSS = model pool use + runtime + loader buffers: a worst case. With `lazy`
//! (the default) and `eager` the whole region is resident at the peak; with `mmap` RSS counts
//! only the weight pages the forward pass touched, so it can stay below the prediction. For a
//! small model whose load ends during start-up, whether the chunk buffer is still alive when the
//! inference footprint is reached is a race: single runs of stories260K peak anywhere between
//! the prediction minus the buffer and the prediction.
//! Cost: maps the file and parses its header, builds the tokenizer (tens of milliseconds for a
//! 150k-token vocabulary); reads no tensor data.

use std::fmt::Write as _;
use std::path::PathBuf;

use airs_engine::KvType;
use airs_engine::footprint::ModelShape as Shape;
use airs_memory::{LoaderKind, PoolBudget};
use airs_runtime::ModelBytes;
use airs_runtime::fit::{
    Estimate, FitRequest as Request, Overhead as Runtime, RUNTIME_BASE_BYTES, THREAD_BYTES,
    Verdict, loader_buffer_bytes, rss_anon,
};
use anyhow::{Context, bail};
use serde_json::json;

use crate::model_file::default_threads;
use crate::pool_args::PoolArgs;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

#[derive(clap::Args, Debug)]
pub struct FitArgs {
    /// The GGUF model file.
    pub model: PathBuf,
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Concurrent sessions, each with its own KV cache.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub sessions: u64,
    /// Tokens of context per session [default: the model's context length].
    #[arg(long, value_name = "TOKENS")]
    pub context: Option<u64>,
    /// KV cache element type: f32, f16 or q8_0.
    #[arg(long, default_value = "f16", value_name = "TYPE")]
    pub kv_type: KvType,
    /// Worker threads of the runtime (per-thread scratch) [default: all cores].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Speculative decoding as `airs run` will do it (its draft rows' logits count).
    #[command(flatten)]
    pub draft: crate::run::DraftArgs,
    /// The loader `airs run` will use: eager, mmap or lazy (its chunk buffers count).
    #[arg(long, default_value = "lazy", value_name = "LOADER")]
    pub loader: LoaderKind,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: FitArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.sessions >= 1, "--sessions must be at least 1");
    if args.threads == Some(0) {
        bail!("--threads must be at least 1");
    }
    let (budget, ram_source) = args.pool.policy().budget()?;

    // Build what `airs run` builds besides the weights — tokenizer, chat template, model
    // tables — and measure it; the file is mapped, so its pages are not anonymous memory.
    let bytes = ModelBytes::open(Some(&args.model))
        .with_context(|| format!("opening {}", args.model.display()))?;
    let before = rss_anon();
    let tokenizer = bytes.tokenizer()?;
    let gguf = bytes.parse()?;
    let template = airs_tokenizer::chat::ChatTemplate::from_gguf(&gguf, &tokenizer);
    let after = rss_anon();
    drop(template);
    let tokenizer = match (before, after) {
        (Some(b), Some(a)) => a.saturating_sub(b),
        _ => 0,
    };
    let shape = Shape::from_gguf(&gguf).with_context(|| bytes.name.clone())?;
    drop(gguf);

    let context = args.context.unwrap_or(shape.context_len);
    anyhow::ensure!(context >= 1, "--context must be at least 1 token");
    anyhow::ensure!(
        context <= shape.context_len,
        "--context {context} exceeds the model's context length of {} tokens",
        shape.context_len
    );
    let threads = args.threads.unwrap_or_else(default_threads) as u64;
    let request = Request {
        sessions: args.sessions,
        context,
        kv: args.kv_type,
        threads,
        draft: args.draft.config(),
    };
    let page = airs_memory::page_size() as u64;
    let est = Estimate::new(&shape, request, budget.model_pool_bytes, page)?;
    let chunk = airs_memory::LoadOptions::default().chunk_bytes as u64;
    let runtime = Runtime {
        base: RUNTIME_BASE_BYTES,
        threads: threads.saturating_sub(1) * THREAD_BYTES,
        tokenizer,
        loader: args.loader,
        loader_buffers: loader_buffer_bytes(args.loader, shape.file_bytes, chunk, page),
    };
    let name = args
        .model
        .file_name()
        .map_or_else(|| bytes.name.clone(), |n| n.to_string_lossy().into());
    if args.json {
        let report = json_report(
            &bytes.name,
            &shape,
            &budget,
            ram_source,
            &request,
            &est,
            &runtime,
        );
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!(
            "{}",
            table(&name, &shape, &budget, ram_source, &request, &est, &runtime)
        );
    }
    Ok(())
}

fn verdict_json(v: Verdict) -> serde_json::Value {
    match v {
        Verdict::Fits => json!({ "verdict": "fits" }),
        Verdict::DoesNotFit => json!({ "verdict": "does_not_fit" }),
        Verdict::FitsWithLimits {
            max_sessions,
            max_context,
        } => json!({
            "verdict": "fits_with_limits",
            "max_sessions": max_sessions,
            "max_context_tokens": max_context,
        }),
    }
}

fn json_report(
    model: &str,
    shape: &Shape,
    budget: &PoolBudget,
    ram_source: &str,
    request: &Request,
    est: &Estimate,
    runtime: &Runtime,
) -> serde_json::Value {
    let pool_use = est.model_pool_use();
    json!({
        "model": model,
        "architecture": shape.arch,
        "budget": {
            "source": ram_source,
            "total_bytes": budget.total_bytes,
            "kernel_bytes": budget.kernel_bytes,
            "reserved_bytes": budget.reserved_bytes,
            "dma_bytes": budget.dma_bytes,
            "user_pool_bytes": budget.user_pool_bytes,
            "model_pool_bytes": budget.model_pool_bytes,
        },
        "request": {
            "sessions": request.sessions,
            "context_tokens": request.context,
            "kv_type": request.kv.name(),
            "threads": request.threads,
        },
        "model_pool": {
            "weights_bytes": est.weights,
            "file_bytes": shape.file_bytes,
            "tensor_bytes": shape.tensor_bytes,
            "kv_bytes_per_token": est.kv_per_token,
            "kv_tokens_per_session": est.tokens_per_session,
            "kv_bytes": est.kv,
            "scratch_bytes": est.scratch.total(),
            "scratch": est.scratch,
            "total_bytes": pool_use,
            "free_bytes": budget.model_pool_bytes.saturating_sub(pool_use),
        },
        "fit": verdict_json(est.verdict),
        "runtime": {
            "base_bytes": runtime.base,
            "thread_bytes": runtime.threads,
            "tokenizer_bytes": runtime.tokenizer,
            "loader": runtime.loader.as_str(),
            "loader_buffer_bytes": runtime.loader_buffers,
            "total_bytes": runtime.total(),
        },
        "predicted_peak_rss_bytes": pool_use + runtime.total(),
    })
}

/// Bytes as MiB with one decimal, or KiB below 1 MiB.
fn size(bytes: u64) -> String {
    if bytes == 0 {
        "0 MiB".to_string()
    } else if bytes >= MIB {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    } else {
        format!("{:.1} KiB", bytes as f64 / KIB as f64)
    }
}

const RULE: &str = "  ─────────────────────────────────────────────────────";

fn line(out: &mut String, label: &str, bytes: u64) {
    let _ = writeln!(out, "{label:<42}{:>12}", size(bytes));
}

fn table(
    name: &str,
    shape: &Shape,
    budget: &PoolBudget,
    ram_source: &str,
    request: &Request,
    est: &Estimate,
    runtime: &Runtime,
) -> String {
    let mut o = String::new();
    let ram = if budget.total_bytes.is_multiple_of(1 << 30) {
        format!("{} GiB", budget.total_bytes >> 30)
    } else {
        size(budget.total_bytes)
    };
    let _ = writeln!(o, "Memory budget of a {ram} device ({ram_source}):\n");
    line(&mut o, "Total RAM:", budget.total_bytes);
    line(&mut o, "  - Kernel:", budget.kernel_bytes);
    line(
        &mut o,
        "  - Reserved (firmware tables, MMIO):",
        budget.reserved_bytes,
    );
    line(&mut o, "  - DMA pool:", budget.dma_bytes);
    line(
        &mut o,
        "  - User pool (OS services, agents,",
        budget.user_pool_bytes,
    );
    let _ = writeln!(o, "    heap, browser, headroom):");
    let _ = writeln!(o, "{RULE}");
    line(&mut o, "  Available for model:", budget.model_pool_bytes);
    if budget.model_pool_bytes == 0 {
        let _ = writeln!(o, "  (no model pool: inference goes to a remote endpoint)");
    }
    let _ = writeln!(
        o,
        "\n{name} ({}, {} layers, {} vocab): {} session{} × {} tokens, {} KV, {} thread{}",
        shape.arch,
        shape.layers,
        shape.vocab,
        request.sessions,
        if request.sessions == 1 { "" } else { "s" },
        request.context,
        request.kv.name(),
        request.threads,
        if request.threads == 1 { "" } else { "s" },
    );
    line(&mut o, "  Weights (file image):", est.weights);
    line(
        &mut o,
        &format!(
            "  KV cache ({} × {} tokens × {} B):",
            request.sessions, est.tokens_per_session, est.kv_per_token
        ),
        est.kv,
    );
    line(
        &mut o,
        &format!("  Scratch (prefill of {} tokens):", est.scratch.rows),
        est.scratch.total(),
    );
    let _ = writeln!(o, "{RULE}");
    let pool_use = est.model_pool_use();
    let verdict = match est.verdict {
        Verdict::Fits => format!("← fits ({} free)", size(budget.model_pool_bytes - pool_use)),
        Verdict::DoesNotFit if budget.model_pool_bytes == 0 => {
            "← does not fit (no model pool)".to_string()
        }
        Verdict::DoesNotFit => "← does not fit".to_string(),
        Verdict::FitsWithLimits {
            max_sessions,
            max_context,
        } => {
            let mut alts = Vec::new();
            if max_sessions > 0 {
                alts.push(format!(
                    "{max_sessions} session{} of {} tokens",
                    if max_sessions == 1 { "" } else { "s" },
                    request.context
                ));
            }
            if max_context > 0 {
                alts.push(format!("{max_context} tokens per session"));
            }
            format!("← fits with at most {}", alts.join(" or "))
        }
    };
    let _ = writeln!(
        o,
        "{:<42}{:>12}  {verdict}",
        "  Model pool use:",
        size(pool_use)
    );
    let _ = writeln!(o, "\nOutside the model pool (user pool):");
    line(
        &mut o,
        "  Runtime (binary, libraries, heap, stacks):",
        runtime.base + runtime.threads,
    );
    line(&mut o, "  Tokenizer tables (measured):", runtime.tokenizer);
    line(
        &mut o,
        &format!("  Loader buffers ({}, during the load):", runtime.loader),
        runtime.loader_buffers,
    );
    let _ = writeln!(o, "{RULE}");
    line(
        &mut o,
        "Predicted peak RSS (model pool + runtime):",
        pool_use + runtime.total(),
    );
    o
}
