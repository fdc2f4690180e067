//! `airs run`: generate text from a prompt or a chat message, streaming it to stdout.
//!
//! The model file is loaded into a model region with `--loader` (default lazy: generation
//! starts while the file is still being read; see `model_file`). While a lazy load fills the
//! region in the background, a progress bar is drawn on stderr when stderr is a terminal; it is
//! cleared once the load completes, or when generated text starts streaming to the same
//! terminal. `--json` reports the loader, the region's memory state (locked, huge-page, read-only,
//! pinned), the time to first token and to fully resident counted from opening the file, and the
//! region's notices; it waits for the load to complete before reporting.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use airs_engine::footprint::{ModelShape, Scratch};
use airs_engine::{
    GenerateConfig, KvShape, KvType, Model, PagedKv, PagedKvConfig, PagedKvPool, Runtime,
    SamplerConfig, generate,
};
use airs_memory::PoolUse;
use airs_tokenizer::chat::{ChatMessage, ChatTemplate};
use airs_tokenizer::{EncodeOptions, Tokenizer};
use anyhow::Context;
use serde_json::json;

use crate::model_file::{LoaderArgs, ModelFile};
use crate::pool_args::{PoolArgs, model_pool_json};

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The GGUF model (default: the embedded stories260K model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Raw prompt text to continue (default: start from BOS alone).
    pub prompt: Option<String>,
    /// A user message, formatted with the model's chat template.
    #[arg(long, conflicts_with = "prompt")]
    pub chat: Option<String>,
    /// A system message for --chat.
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Most tokens to generate.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop when the text contains this string (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// KV cache element type.
    #[arg(long, default_value = "f16")]
    pub kv_type: KvType,
    #[command(flatten)]
    pub load: LoaderArgs,
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
}

/// A model file opened for inference: weights, tokenizer, chat template.
pub struct Loaded {
    pub file: ModelFile,
    pub model: Model,
    /// What the model needs besides weights (the scratch estimate).
    pub shape: ModelShape,
    pub tokenizer: Tokenizer,
    pub template: Result<ChatTemplate, String>,
}

impl Loaded {
    pub fn open(file: ModelFile) -> anyhow::Result<Loaded> {
        // A lazy load that failed (e.g. the file was truncated) explains any error it caused.
        let load_failed = || match file.image.load_error() {
            Some(e) => Err(anyhow::anyhow!("loading {}: {e}", file.name)),
            None => Ok(()),
        };
        let gguf = file.parse();
        load_failed()?;
        let gguf = gguf?;
        let model = Model::new(file.image.clone(), &gguf);
        load_failed()?;
        let model = model.with_context(|| file.name.clone())?;
        let shape = ModelShape::from_gguf(&gguf).with_context(|| file.name.clone())?;
        let tokenizer = Tokenizer::from_gguf(&gguf).with_context(|| file.name.clone())?;
        let template = ChatTemplate::from_gguf(&gguf, &tokenizer).map_err(|e| e.to_string());
        drop(gguf);
        Ok(Loaded {
            file,
            model,
            shape,
            tokenizer,
            template,
        })
    }

    pub fn kv_shape(&self) -> KvShape {
        KvShape {
            layers: self.model.config.layers,
            kv_heads: self.model.config.kv_heads,
            head_dim: self.model.config.head_dim,
        }
    }
}

pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Peak resident set size of this process (VmHWM), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The background-fill progress bar on stderr (a thread polling the loader).
struct FillProgress {
    bar: indicatif::ProgressBar,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FillProgress {
    /// A bar for `file`'s lazy load, if it is still filling and stderr is a terminal.
    fn start(file: &ModelFile) -> Option<FillProgress> {
        let region = file.region.as_ref()?;
        let loader = region.loader();
        if region.loader_kind() != airs_memory::LoaderKind::Lazy
            || loader.is_resident()
            || !std::io::stderr().is_terminal()
        {
            return None;
        }
        let total = loader.progress().total_bytes;
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(total),
            indicatif::ProgressDrawTarget::stderr(),
        );
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "loading {bytes:>10}/{total_bytes} [{bar:30}] {bytes_per_sec} {msg}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s) = (bar.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("airs-progress".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    b.set_position(loader.progress().filled_bytes);
                    // Resident (true) or failed (error): either way the fill is over.
                    if loader
                        .wait_resident_timeout(Duration::from_millis(100))
                        .unwrap_or(true)
                    {
                        break;
                    }
                }
                b.finish_and_clear();
            })
            .ok()?;
        Some(FillProgress {
            bar,
            stop,
            thread: Some(thread),
        })
    }

    /// Clears the bar and stops its thread.
    fn finish(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.bar.finish_and_clear();
    }
}

impl Drop for FillProgress {
    fn drop(&mut self) {
        self.finish();
    }
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    // One model pool account: weights (through the registry), scratch and KV cache.
    let registry = args.pool.registry()?;
    let file = ModelFile::open_for_inference(args.model.as_deref(), &args.load, &registry)?;
    let opened_at = file.opened_at;
    let mut progress = FillProgress::start(&file);
    let loaded = Loaded::open(file)?;
    let load_ms = opened_at.elapsed().as_secs_f64() * 1e3;
    let tok = &loaded.tokenizer;

    let prompt_ids: Vec<u32> = if let Some(user) = &args.chat {
        let template = loaded
            .template
            .as_ref()
            .map_err(|e| anyhow::anyhow!("chat template: {e}"))?;
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::system(system.clone()));
        }
        messages.push(ChatMessage::user(user.clone()));
        template
            .encode(tok, &messages, true)
            .context("rendering the chat template")?
            .into_iter()
            .map(u32::from)
            .collect()
    } else {
        let text = args.prompt.as_deref().unwrap_or("");
        let mut ids: Vec<u32> = tok
            .encode(text, EncodeOptions::prompt(tok))
            .into_iter()
            .map(u32::from)
            .collect();
        if ids.is_empty() {
            let bos = tok
                .bos_id()
                .context("the prompt is empty and the model has no BOS token to start from")?;
            ids.push(bos.into());
        }
        ids
    };

    let context_len = loaded.model.config.context_len;
    anyhow::ensure!(
        prompt_ids.len() < context_len,
        "the prompt has {} tokens but the model's context holds {context_len}",
        prompt_ids.len()
    );
    let capacity = (prompt_ids.len() + args.max_tokens).min(context_len);
    // The paged KV cache: a pool sized for this one sequence, filled block by block on demand.
    let bytes_per_token = loaded
        .kv_shape()
        .bytes_per_token(args.kv_type)
        .with_context(|| {
            format!(
                "a {} KV cache cannot hold this model's heads of {} values",
                args.kv_type.name(),
                loaded.model.config.head_dim
            )
        })?;
    let pool_bytes =
        capacity.next_multiple_of(airs_memory::DEFAULT_TOKENS_PER_BLOCK as usize) * bytes_per_token;
    let rt = Runtime::new(args.threads.unwrap_or_else(default_threads));
    let scratch_bytes = Scratch::new(&loaded.shape, capacity as u64, rt.pool.threads() as u64);
    let _scratch =
        registry
            .pool()
            .charge(PoolUse::Scratch, scratch_bytes.total(), "forward passes")?;
    let kv_pool = PagedKvPool::new_charged(
        loaded.kv_shape(),
        args.kv_type,
        &PagedKvConfig::new(pool_bytes),
        registry.pool(),
    )?;
    let mut kv = PagedKv::new_sequence(&kv_pool, None).with_max_len(capacity);
    let config = GenerateConfig {
        max_tokens: args.max_tokens,
        stop_strings: args.stop.clone(),
        sampler: SamplerConfig {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            repeat_penalty: args.repeat_penalty,
            seed: args.seed,
            ..SamplerConfig::default()
        },
        prefill_batch: 512,
    };
    let stdout = std::io::stdout();
    // Streamed text and a redrawn bar cannot share a terminal: the text wins.
    let stdout_is_terminal = stdout.is_terminal();
    let mut on_text = |piece: &str| {
        if !args.json {
            if stdout_is_terminal && let Some(mut p) = progress.take() {
                p.finish();
            }
            let mut out = stdout.lock();
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
        }
    };
    if !args.json && args.prompt.is_some() {
        on_text(args.prompt.as_deref().unwrap_or(""));
    }
    let generate_started = Instant::now();
    let generation = generate(
        &loaded.model,
        &rt,
        tok,
        &mut kv,
        &prompt_ids,
        &config,
        &mut on_text,
    )?;
    let ttft_from_open =
        generate_started.duration_since(opened_at) + generation.time_to_first_token;
    let file = &loaded.file;
    if args.json {
        // Report the final memory state: locked, huge pages and read-only come at the end.
        file.wait_resident()?;
    }
    if let Some(mut p) = progress.take() {
        p.finish();
    }
    if args.json {
        file.print_new_notices();
        let stats = file.region.as_ref().map(|r| r.stats());
        let notices: Vec<String> = file.notices().iter().map(|n| n.to_string()).collect();
        let report = json!({
            "model": loaded.file.name,
            "loader": file.loader_name(),
            "region_bytes": stats.as_ref().map_or(file.image.bytes().len() as u64, |s| s.bytes),
            "locked_bytes": stats.as_ref().map_or(0, |s| s.locked_bytes),
            "huge_page_bytes": stats.as_ref().map_or(0, |s| s.huge_page_bytes),
            // The embedded model lives in the binary's read-only data.
            "read_only": stats.as_ref().is_none_or(|s| s.read_only),
            "pinned": stats.as_ref().is_some_and(|s| s.pinned),
            "ttft_ms": ttft_from_open.as_secs_f64() * 1e3,
            "fully_resident_ms": file.fully_resident_after_open().map(|d| d.as_secs_f64() * 1e3),
            "notices": notices,
            "prompt_token_ids": prompt_ids,
            "generated_token_ids": generation.generated,
            "text": generation.text,
            "stop_reason": generation.stop_reason.name(),
            "threads": rt.pool.threads(),
            "isa": format!("{:?}", rt.isa).to_lowercase(),
            "kv_type": args.kv_type.name(),
            "timings": {
                "load_ms": load_ms,
                "ttft_ms": generation.time_to_first_token.as_secs_f64() * 1e3,
                "prefill_tokens": generation.prefill_tokens,
                "prefill_tokens_per_s": generation.prefill_tokens_per_s(),
                "decode_tokens": generation.decode_tokens,
                "decode_tokens_per_s": generation.decode_tokens_per_s(),
            },
            "memory": {
                "weights_bytes": loaded.model.weight_bytes(),
                "kv_bytes": airs_engine::KvCache::allocated_bytes(&kv),
                "kv_pool": kv_pool_json(&kv_pool.stats()),
                "model_pool": model_pool_json(registry.pool()),
                "peak_rss_bytes": peak_rss_bytes(),
            },
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!();
        file.print_new_notices();
        eprintln!(
            "[{} prompt tokens at {:.1} t/s, {} generated at {:.1} t/s, stop: {}]",
            generation.prefill_tokens,
            generation.prefill_tokens_per_s(),
            generation.generated.len(),
            generation.decode_tokens_per_s(),
            generation.stop_reason.name()
        );
    }
    Ok(())
}

/// The paged KV pool's accounting, for `--json`.
pub fn kv_pool_json(s: &airs_memory::KvPoolStats) -> serde_json::Value {
    json!({
        "pool_bytes": s.pool_bytes,
        "block_bytes": s.block_bytes,
        "bytes_per_token": s.bytes_per_token,
        "tokens_per_block": s.tokens_per_block,
        "blocks_total": s.blocks_total,
        "blocks_used": s.blocks_used,
        "blocks_free": s.blocks_free,
        "blocks_cached": s.blocks_cached,
        "used_bytes": s.used_bytes,
        "tokens_stored": s.tokens_stored,
        "waste_bytes": s.waste_bytes,
        "shared_blocks": s.shared_blocks,
        "shared_refcounts": s.shared_refcounts,
        "shared_savings_bytes": s.shared_savings_bytes,
        "pinned": s.pinned,
    })
}
