//! `airs fit MODEL`: will this model run on this device? Splits the device's RAM into pools as
//! the design does (§6.1 of `shared/design/model-memory.md`, rule in `airs_memory::budget`),
//! estimates what the model needs in the model pool — the weights (the file image the model
//! region holds), the paged KV cache of `--sessions` × `--context` tokens, and the scratch of a
//! forward pass — and gives a verdict: fits, does not fit, or fits with at most K sessions or
//! C tokens per session. It then adds the runtime overhead that lives outside the model pool to
//! predict the peak resident set of `airs run`.
//!
//! The runtime enforces what `fit` predicts: `airs run`, `airs session` and `airs bench sessions`
//! charge the same weights, KV pool and scratch ([`airs_engine::footprint`]) to one model-pool
//! account before allocating them, with the same `--device-ram`/`--model-pool` flags.
//!
//! What is inside the model pool (the verdict compares this with the pool):
//! - **weights**: the whole GGUF file rounded up to the base page, header included — the model
//!   region is a byte-for-byte image of the file (§6.2) and is what the model registry charges;
//! - **KV cache**: 2 × layers × kv_heads × the bytes of one head row (f32: 4 × head_dim, f16:
//!   2 × head_dim, q8_0: 34 per 32 values) per token, allocated in blocks of 16 tokens, so each
//!   session's context is rounded up to a multiple of 16 (§6.3);
//! - **scratch**: the activation buffers of one forward pass, for a prefill batch of
//!   min(512, context) rows (decode is one row, never more): residual, norm output, attention
//!   projection output (`n_embd` each), q and attention output (`q_len`), k and v (`kv_len`),
//!   gate and up (`n_ff`), RoPE table, the quantized activation copies (one per activation
//!   encoding the weights use, sized for the widest input, plus the tiled kernels' prepared
//!   copy), per-thread matmul tiles and attention score buffers (group × context floats), the
//!   last row's logits (vocab × 4 bytes), the sampler's candidate arrays (vocab × 16 bytes) and,
//!   for a context longer than one batch, the residual stream of up to 4 batches, which a
//!   prefill holds while it runs layer-major over a model still loading.
//!
//! Outside the model pool (user pool), but in the process's resident set:
//! - **runtime**: the binary's code and data and the shared libraries resident while inference
//!   runs, the allocator's and main thread's base ([`RUNTIME_BASE_BYTES`], measured, see there),
//!   one stack per worker thread ([`THREAD_BYTES`]), and the tokenizer and chat-template tables,
//!   which `fit` measures by building them exactly as `airs run` does (growth of the process's
//!   anonymous resident memory, `RssAnon`, while building);
//! - **loader buffers**: the lazy loader's fault handler and filler each read a chunk
//!   (`min(2 MiB, file)`) into a buffer before copying it into the region, and keep it until the
//!   load ends; a load of more than one chunk runs while inference starts, so both buffers are
//!   counted (one for a one-chunk file, none for `eager` and `mmap`).
//!
//! Predicted peak RSS = model pool use + runtime + loader buffers: a worst case. With `lazy`
//! (the default) and `eager` the whole region is resident at the peak; with `mmap` RSS counts
//! only the weight pages the forward pass touched, so it can stay below the prediction. For a
//! small model whose load ends during start-up, whether the chunk buffer is still alive when the
//! inference footprint is reached is a race: single runs of stories260K peak anywhere between
//! the prediction minus the buffer and the prediction.
//! Cost: maps the file and parses its header, builds the tokenizer (tens of milliseconds for a
//! 150k-token vocabulary); reads no tensor data beyond the norm vectors.

use std::fmt::Write as _;
use std::path::PathBuf;

use airs_engine::footprint::{ModelShape as Shape, Scratch};
use airs_memory::LoaderKind;
use airs_memory::budget::{KvElement, PoolBudget, kv_bytes_per_token_of};
use anyhow::{Context, bail};
use serde_json::json;

use crate::model_file::ModelFile;
use crate::pool_args::PoolArgs;
use crate::run::{Loaded, default_threads};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// Tokens per KV block (the paged KV cache allocates whole blocks).
pub const KV_BLOCK_TOKENS: u64 = 16;
/// The runtime's base resident memory: the `airs` binary's code and data, libc, libm, libgcc_s
/// and the dynamic loader as resident while `airs run` generates, the allocator's initial heap
/// and the main thread's stack. Measured on x86-64 Linux with `/proc/PID/smaps` at the end of
/// `airs run --json` on stories260K, where nothing else is large, and as the peak of
/// `airs run --loader eager` on it minus its region, KV cache, scratch and tokenizer:
/// - builds with debug assertions (the `test` profile, which `cargo test` runs): 7.0 MiB — the
///   `airs` mappings 4.5–4.9 MiB (how much of the binary the kernel maps around the pages
///   touched varies from run to run), shared libraries 2.1–2.3 MiB, heap and stack 0.2 MiB;
/// - release builds: 6.25 MiB (the `airs` mappings 3.9–4.0 MiB);
/// - plus 0.75 MiB since the binary links SQLite (the session store), measured the same way.
///
/// Other targets (aarch64) differ by their code size; re-measure there with
/// `airs run --loader eager --json` on stories260K.
pub const RUNTIME_BASE_BYTES: u64 = if cfg!(debug_assertions) {
    7_750 * KIB
} else {
    7_000 * KIB
};
/// Resident memory per worker thread besides its scratch: stack pages touched and thread
/// control block (measured: 20–40 KiB; rounded up).
pub const THREAD_BYTES: u64 = 64 * KIB;

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
    pub kv_type: KvElement,
    /// Worker threads of the runtime (per-thread scratch) [default: all cores].
    #[arg(long)]
    pub threads: Option<usize>,
    /// The loader `airs run` will use: eager, mmap or lazy (its chunk buffers count).
    #[arg(long, default_value = "lazy", value_name = "LOADER")]
    pub loader: LoaderKind,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Parses a size: a number with an optional binary unit (K, M, G, T, with or without `B` or
/// `iB`, any case): `4G`, `4096M`, `8GiB`, `1.5G`, `512mb`, `1048576`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "unknown unit {other:?} in size {s:?} (use K, M, G or T, e.g. 4G or 4096M)"
            ));
        }
    };
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 4G, 4096M, 8GiB)"))?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(format!("size {s:?} is out of range"));
    }
    Ok(bytes.round() as u64)
}

/// What was asked: sessions of a context with a KV type, on a number of threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub sessions: u64,
    pub context: u64,
    pub kv: KvElement,
    pub threads: u64,
}

/// The verdict for the model pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Fits,
    /// Fits only with fewer sessions (`max_sessions` of the requested context) or a shorter
    /// context (`max_context` tokens for each of the requested sessions); either may be 0.
    FitsWithLimits {
        max_sessions: u64,
        max_context: u64,
    },
    DoesNotFit,
}

/// The estimate for one model and request against one budget.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    pub weights: u64,
    pub kv_per_token: u64,
    /// Each session's context rounded up to whole KV blocks.
    pub tokens_per_session: u64,
    pub kv: u64,
    pub scratch: Scratch,
    pub verdict: Verdict,
}

impl Estimate {
    pub fn new(
        shape: &Shape,
        request: Request,
        pool_bytes: u64,
        page_bytes: u64,
    ) -> anyhow::Result<Estimate> {
        let u32_of = |x: u64| u32::try_from(x).unwrap_or(u32::MAX);
        let kv_per_token = kv_bytes_per_token_of(
            u32_of(shape.layers),
            u32_of(shape.head_dim),
            u32_of(shape.kv_heads),
            request.kv,
        )
        .with_context(|| {
            format!(
                "a {} KV cache cannot hold heads of {} values (q8_0 needs a multiple of 32)",
                request.kv.name(),
                shape.head_dim
            )
        })?;
        let weights = shape.file_bytes.div_ceil(page_bytes) * page_bytes;
        let tokens_per_session = request.context.next_multiple_of(KV_BLOCK_TOKENS);
        let kv = request.sessions * tokens_per_session * kv_per_token;
        let scratch = Scratch::new(shape, request.context, request.threads);
        let fixed = weights + scratch.total();
        let verdict = if fixed + kv <= pool_bytes {
            Verdict::Fits
        } else if fixed + KV_BLOCK_TOKENS * kv_per_token > pool_bytes {
            Verdict::DoesNotFit
        } else {
            let room = pool_bytes - fixed;
            let block = KV_BLOCK_TOKENS * kv_per_token;
            Verdict::FitsWithLimits {
                max_sessions: room / (tokens_per_session * kv_per_token).max(1),
                max_context: room / request.sessions.max(1) / block * KV_BLOCK_TOKENS,
            }
        };
        Ok(Estimate {
            weights,
            kv_per_token,
            tokens_per_session,
            kv,
            scratch,
            verdict,
        })
    }

    /// Weights + KV + scratch: what the model takes from the model pool.
    pub fn model_pool_use(&self) -> u64 {
        self.weights + self.kv + self.scratch.total()
    }
}

/// The runtime overhead outside the model pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Runtime {
    pub base: u64,
    pub threads: u64,
    pub tokenizer: u64,
    pub loader: LoaderKind,
    /// The loader's chunk buffers while the load runs.
    pub loader_buffers: u64,
}

impl Runtime {
    pub fn total(&self) -> u64 {
        self.base + self.threads + self.tokenizer + self.loader_buffers
    }
}

/// Bytes of the chunk buffers `loader` holds while loading a `file_bytes` file: the lazy
/// loader's fault handler and filler each read chunks of `chunk_bytes` through one buffer; a
/// file of one chunk is read by one of them.
pub fn loader_buffer_bytes(
    loader: LoaderKind,
    file_bytes: u64,
    chunk_bytes: u64,
    page_bytes: u64,
) -> u64 {
    match loader {
        LoaderKind::Lazy => {
            let chunks = file_bytes.div_ceil(chunk_bytes);
            let buffer = chunk_bytes.min(file_bytes).next_multiple_of(page_bytes);
            chunks.min(2) * buffer
        }
        LoaderKind::Eager | LoaderKind::Mmap => 0,
    }
}

/// Anonymous resident memory of this process (`RssAnon`), in bytes.
fn rss_anon() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * KIB)
}

pub fn run(args: FitArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.sessions >= 1, "--sessions must be at least 1");
    if args.threads == Some(0) {
        bail!("--threads must be at least 1");
    }
    let (budget, ram_source) = args.pool.budget()?;

    // Build what `airs run` builds besides the weights — tokenizer, chat template, model
    // tables — and measure it; the file is mapped, so its pages are not anonymous memory.
    let before = rss_anon();
    let loaded = Loaded::open(ModelFile::open(Some(&args.model))?)?;
    let after = rss_anon();
    let tokenizer = match (before, after) {
        (Some(b), Some(a)) => a.saturating_sub(b),
        _ => 0,
    };
    let gguf = loaded.file.parse()?;
    let shape = Shape::from_gguf(&gguf).with_context(|| loaded.file.name.clone())?;
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
        .map_or_else(|| loaded.file.name.clone(), |n| n.to_string_lossy().into());
    if args.json {
        let report = json_report(
            &loaded.file.name,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen_like() -> Shape {
        Shape {
            arch: "qwen2".into(),
            file_bytes: 491_400_064,
            tensor_bytes: 485_452_288,
            layers: 24,
            embd: 896,
            heads: 14,
            kv_heads: 2,
            head_dim: 64,
            ff: 4864,
            vocab: 151_936,
            context_len: 32768,
            rope_dims: 64,
            act_row_bytes: 5548 + 5168,
            max_act_row_bytes: 5548,
            max_layer_rows: 4864,
        }
    }

    fn req(sessions: u64, context: u64) -> Request {
        Request {
            sessions,
            context,
            kv: KvElement::F16,
            threads: 4,
        }
    }

    #[test]
    fn sizes_parse_in_binary_units() {
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("4096M"), Ok(4 << 30));
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));
        assert_eq!(parse_size("8gb"), Ok(8 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert!(parse_size("4X").unwrap_err().contains("unknown unit"));
        assert!(parse_size("G").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn kv_rounds_each_session_to_whole_blocks() {
        let e = Estimate::new(&qwen_like(), req(3, 21), 2 << 30, 4096).unwrap();
        assert_eq!(e.kv_per_token, 2 * 24 * 2 * 64 * 2);
        assert_eq!(e.tokens_per_session, 32);
        assert_eq!(e.kv, 3 * 32 * 12288);
        assert_eq!(e.weights, 491_401_216);
        assert_eq!(e.verdict, Verdict::Fits);
        let q8 = Estimate::new(
            &qwen_like(),
            Request {
                kv: KvElement::Q8_0,
                ..req(1, 16)
            },
            2 << 30,
            4096,
        )
        .unwrap();
        assert_eq!(q8.kv_per_token, 2 * 24 * 2 * 68);
    }

    #[test]
    fn scratch_is_sized_for_the_prefill_batch() {
        let s = qwen_like();
        let small = Scratch::new(&s, 20, 2);
        assert_eq!(small.rows, 20);
        let big = Scratch::new(&s, 32768, 2);
        assert_eq!(big.rows, 512);
        // f32 activations of a 512-row batch: (3·896 + 2·896 + 2·128 + 2·4864) · 4 B per row.
        assert_eq!(
            big.activations,
            512 * ((3 * 896 + 2 * 896 + 2 * 128 + 2 * 4864) * 4 + 256)
        );
        assert_eq!(big.logits, 896 * 4 + 151_936 * 4);
        // Per-thread attention scores: 7 query heads per KV head × context floats.
        assert!(big.per_thread >= 2 * 7 * 32768 * 4);
        assert!(big.total() > 30 << 20 && big.total() < 60 << 20, "{big:?}");
    }

    #[test]
    fn verdicts_and_limits() {
        let s = qwen_like();
        // 4 sessions × 32K f16 tokens = 1.5 GiB of KV: too much for a 2 GiB pool.
        let e = Estimate::new(&s, req(4, 32768), 2 << 30, 4096).unwrap();
        let Verdict::FitsWithLimits {
            max_sessions,
            max_context,
        } = e.verdict
        else {
            panic!("{:?}", e.verdict)
        };
        let room = (2u64 << 30) - e.weights - e.scratch.total();
        assert_eq!(max_sessions, room / (32768 * 12288));
        assert_eq!(max_sessions, 3);
        assert_eq!(max_context % 16, 0);
        assert!(4 * max_context * 12288 <= room);
        assert!(4 * (max_context + 16) * 12288 > room);
        // A pool smaller than the weights: does not fit; no pool at all: does not fit.
        assert_eq!(
            Estimate::new(&s, req(1, 16), 400 << 20, 4096)
                .unwrap()
                .verdict,
            Verdict::DoesNotFit
        );
        assert_eq!(
            Estimate::new(&s, req(1, 16), 0, 4096).unwrap().verdict,
            Verdict::DoesNotFit
        );
        // q8_0 needs head_dim % 32 == 0.
        let odd = Shape {
            head_dim: 8,
            ..qwen_like()
        };
        let err = Estimate::new(
            &odd,
            Request {
                kv: KvElement::Q8_0,
                ..req(1, 16)
            },
            2 << 30,
            4096,
        )
        .unwrap_err();
        assert!(err.to_string().contains("multiple of 32"), "{err}");
    }
}
