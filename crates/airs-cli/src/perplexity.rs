//! `airs perplexity`: perplexity of a model over a text and, with `--kld-ref`, the KL divergence
//! of its next-token distributions from a reference engine's (llama-perplexity's protocol; the
//! evaluation is the runtime's: [`airs_runtime::perplexity`]).

use std::io::IsTerminal;
use std::path::PathBuf;

use airs_engine::KvType;
use airs_runtime::perplexity::{self, KldReference, PerplexityConfig, PerplexityReport};
use anyhow::Context;
use serde_json::json;

use crate::model_file::{LoaderArgs, default_threads, load};

/// References are a few MB (1,020 positions × 32 entries); refuse anything far larger before
/// reading it.
const MAX_REFERENCE_BYTES: u64 = 512 << 20;

#[derive(clap::Args, Debug)]
pub struct PerplexityArgs {
    /// The text to evaluate (UTF-8; no chat template, special-token text stays text).
    pub file: PathBuf,
    /// The GGUF model (default: the embedded stories260K model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Tokens per chunk; each chunk's second half is scored.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// At most this many chunks (default: all whole chunks, or the reference's).
    #[arg(long)]
    pub chunks: Option<usize>,
    /// KV cache element type.
    #[arg(long, default_value = "f16")]
    pub kv_type: KvType,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// A reference engine's next-token distributions over the same text (JSON, see
    /// testdata/reference/README.md): report the KL divergence from it.
    #[arg(long, value_name = "REF.json")]
    pub kld_ref: Option<PathBuf>,
    #[command(flatten)]
    pub load: LoaderArgs,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: PerplexityArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let reference = args
        .kld_ref
        .as_ref()
        .map(|path| -> anyhow::Result<KldReference> {
            let len = std::fs::metadata(path)
                .with_context(|| format!("reading {}", path.display()))?
                .len();
            anyhow::ensure!(
                len <= MAX_REFERENCE_BYTES,
                "{}: {len} bytes is not a KLD reference (at most {MAX_REFERENCE_BYTES})",
                path.display()
            );
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            KldReference::parse(&bytes).with_context(|| path.display().to_string())
        })
        .transpose()?;
    let registry = crate::pool_args::PoolArgs::default().registry()?;
    let threads = args.threads.unwrap_or_else(default_threads);
    let model = load(args.model.as_deref(), &args.load, &registry, threads)?;
    let tokens = perplexity::tokenize(&model, &text);
    let config = PerplexityConfig {
        ctx: args.ctx,
        chunks: args.chunks,
        kv_type: args.kv_type,
    };
    let show_progress = !args.json && std::io::stderr().is_terminal();
    let report = perplexity::evaluate(
        &model,
        &tokens,
        &config,
        reference.as_ref(),
        &mut |done, all| {
            if show_progress {
                eprint!("\rchunk {done}/{all}");
            }
        },
    )?;
    if show_progress {
        eprintln!();
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report_json(
                &model.name,
                &args,
                &report,
                reference.as_ref()
            ))?
        );
    } else {
        print_report(&model.name, &args, &report, reference.as_ref());
    }
    Ok(())
}

fn report_json(
    model: &str,
    args: &PerplexityArgs,
    r: &PerplexityReport,
    reference: Option<&KldReference>,
) -> serde_json::Value {
    let mut v = json!({
        "model": model,
        "file": args.file.display().to_string(),
        "kv_type": args.kv_type.name(),
        "ctx": r.ctx,
        "chunks": r.chunks,
        "text_tokens": r.text_tokens,
        "positions": r.positions,
        "perplexity": r.perplexity,
        "tokens_per_s": r.tokens_per_s,
        "seconds": r.elapsed.as_secs_f64(),
    });
    if let (Some(k), Some(reference)) = (&r.kld, reference) {
        v["kld"] = json!({
            "mean": k.mean,
            "median": k.median,
            "p99": k.p99,
            "max": k.max,
        });
        v["top1_agreement"] = json!(k.top1_agreement);
        v["top1_max_disagreement_margin"] = json!(k.max_disagreement_margin());
        v["top1_disagreements"] = json!(
            k.disagreements
                .iter()
                .map(|d| json!({
                    "position": d.position,
                    "reference_top": d.reference_top,
                    "airs_top": d.airs_top,
                    "reference_margin": d.reference_margin,
                }))
                .collect::<Vec<_>>()
        );
        v["mean_abs_dp"] = json!(k.mean_abs_dp);
        v["reference"] = json!({
            "file": args.kld_ref.as_ref().map(|p| p.display().to_string()),
            "model": reference.model,
            "kv_type": reference.kv_type,
            "top_k": reference.top_k,
            "perplexity": k.reference_perplexity,
            // Checked before evaluating: a reference made from other tokens is an error.
            "tokenization_matches": true,
        });
        v["perplexity_ratio"] = json!(r.perplexity / k.reference_perplexity);
    }
    v
}

fn print_report(
    model: &str,
    args: &PerplexityArgs,
    r: &PerplexityReport,
    reference: Option<&KldReference>,
) {
    println!(
        "{model}: {} chunks of {} tokens ({} of {} text tokens), {} KV, {} scored positions",
        r.chunks,
        r.ctx,
        r.chunks * r.ctx,
        r.text_tokens,
        args.kv_type.name(),
        r.positions
    );
    println!(
        "perplexity {:.4}  ({:.1} tokens/s, {:.2} s)",
        r.perplexity,
        r.tokens_per_s,
        r.elapsed.as_secs_f64()
    );
    if let (Some(k), Some(reference)) = (&r.kld, reference) {
        println!(
            "reference {} ({} KV, top {}): tokenization matches, perplexity {:.4} (ratio {:.4})",
            reference.model,
            reference.kv_type,
            reference.top_k,
            k.reference_perplexity,
            r.perplexity / k.reference_perplexity
        );
        println!(
            "KLD mean {:.6}  median {:.6}  p99 {:.6}  max {:.6}",
            k.mean, k.median, k.p99, k.max
        );
        println!(
            "top-1 agreement {:.2}%  mean |Δp| of the reference's top token {:.5}",
            k.top1_agreement * 100.0,
            k.mean_abs_dp
        );
        if !k.disagreements.is_empty() {
            let mut margins: Vec<f64> =
                k.disagreements.iter().map(|d| d.reference_margin).collect();
            margins.sort_by(f64::total_cmp);
            println!(
                "top-1 differs at {} positions, where the reference preferred its token by a median \
                 {:.3} and at most {:.3} nats",
                margins.len(),
                margins[margins.len() / 2],
                k.max_disagreement_margin()
            );
        }
    }
}
