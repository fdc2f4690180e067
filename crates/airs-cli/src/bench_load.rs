//! `airs bench load`: what each model loader costs before and after the first token.
//!
//! For each loader (`eager`, `mmap`, `lazy`; all three unless `--loader` picks one) and each
//! repetition, it measures:
//! - **TTFT**: opening the file → model region → `Model` → prefill of the prompt → first sampled
//!   token (greedy), one request through the runtime's scheduler (which runs a long prompt
//!   layer-major while the weights load). The prompt is tokenized beforehand, outside the
//!   timing (tokenizer construction is the same for every loader).
//! - **fully resident**: opening → every byte in memory. For `eager` and `lazy` that is when the
//!   region was filled and finalized (huge pages, read-only, pinned); for `mmap`, whose pages the
//!   kernel reads on demand and does not report, it is when the benchmark, after token 1, has
//!   touched every page of the mapping.
//! - **decode tokens/s** once resident, after a short warm-up (a lazy region must cost nothing
//!   then), and **resident TTFT**: the same prefill again on the now-resident model (the compute
//!   floor of TTFT; measured in the first repetition only, a prefill is not cheap).
//!
//! Decode speed on a shared, noisy machine drifts more between measurements than the loaders
//! differ, so when more than one loader is measured, a final **interleaved decode** phase holds
//! every loader's resident model at once (after the same prompt) and alternates bursts of
//! `--gen-tokens / 4` decode steps between them for 8 rounds: drift then hits all loaders alike.
//!
//! `--storage-mbps N` paces the loader's reads to N·10⁶ bytes/s (airs-memory's
//! `storage_bytes_per_s`, emulating SD-card storage). `mmap` is read by the kernel and is **not**
//! paced: its numbers are those of the real device (or page cache). `--cold` drops the page cache
//! before each measurement (`sync`, then 1 → /proc/sys/vm/drop_caches: root only; without
//! permission the benchmark says so and runs warm). Without `--cold` the file is read into the
//! page cache before each measurement, so every loader starts from the same warm cache (eager and
//! lazy drop the cached pages they copied, which would otherwise make later runs colder).
//!
//! The **TTFT limit** is the storage bound of the first token: the bytes token 1 needs — the
//! header, every layer, the output norm and head, and the embedding rows of the prompt's tokens
//! (the whole table when the output head is tied to it) — counted in the loader's chunks, over
//! the storage bandwidth. Reported only with `--storage-mbps`.
//! Results are medians over `--reps` repetitions, loaders interleaved within each repetition.
//! Cost: per measurement one full load, one prefill, `--gen-tokens` + 4 decode steps (plus one
//! more prefill in the first repetition); the model's size in memory, one region at a time.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use airs_engine::image::region_layout;
use airs_engine::{KvType, TensorRef};
use airs_memory::{LoadOptions, LoaderKind, ModelRegistry, RegionLayout, SpanKind};
use airs_runtime::fit::single_sequence_config;
use airs_runtime::{Event, GenerationParams, LoadedModel, Prompt, Request, Scheduler};
use anyhow::Context;
use serde_json::json;

use crate::bench::{median, prompt_tokens};
use crate::model_file::{default_threads, loader_parser};

/// Decode steps run before decode is timed.
const WARMUP_TOKENS: usize = 4;
/// Rounds of the interleaved decode phase.
const ROUNDS: usize = 8;

#[derive(clap::Args, Debug)]
pub struct BenchLoadArgs {
    /// The GGUF model file.
    #[arg(long)]
    pub model: PathBuf,
    /// Measure only this loader [default: eager, mmap and lazy]
    #[arg(long, value_name = "LOADER", value_parser = loader_parser())]
    pub loader: Option<LoaderKind>,
    /// Pace the loader's reads to N MB/s (10^6 bytes/s) to emulate slow storage; mmap, read by
    /// the kernel, is not paced.
    #[arg(long, value_name = "N")]
    pub storage_mbps: Option<f64>,
    /// Drop the page cache before each measurement (needs root).
    #[arg(long)]
    pub cold: bool,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Decode steps timed once resident (after 4 warm-up steps).
    #[arg(long, default_value_t = 32)]
    pub gen_tokens: usize,
    /// Repetitions; medians are reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long, default_value = "f16")]
    pub kv_type: KvType,
    #[arg(long)]
    pub json: bool,
}

impl BenchLoadArgs {
    fn storage_bytes_per_s(&self) -> Option<u64> {
        self.storage_mbps.map(|m| (m * 1e6).round() as u64)
    }
}

/// One measurement of one loader.
#[derive(Debug, Clone)]
struct Measurement {
    /// The loader that ran (a `lazy` request may run as `mmap`).
    used: LoaderKind,
    ttft: Duration,
    fully_resident: Duration,
    decode_tokens_per_s: f64,
    resident_ttft: Option<Duration>,
    /// Bytes the loader had copied when token 1 was sampled (None for mmap: not tracked).
    loaded_at_first_token: Option<u64>,
    locked_bytes: u64,
    huge_page_bytes: u64,
    read_only: bool,
    pinned: bool,
    notices: Vec<String>,
}

/// What the benchmark needs from the model, read once through a plain map before timing.
struct Prepared {
    prompt: Vec<u32>,
    file_len: u64,
    first_token_bytes: u64,
}

fn prepare(args: &BenchLoadArgs, chunk_bytes: u64) -> anyhow::Result<Prepared> {
    let loaded = LoadedModel::open(&args.model, 1)?;
    let context = loaded.context_len();
    anyhow::ensure!(
        args.prompt_tokens >= 1 && positions_needed(args) <= context,
        "--prompt-tokens {} with --gen-tokens {} needs {} positions; the context holds {context}",
        args.prompt_tokens,
        args.gen_tokens,
        positions_needed(args)
    );
    let prompt = prompt_tokens(&loaded, args.prompt_tokens);
    let layout =
        region_layout(&args.model).with_context(|| format!("reading {}", args.model.display()))?;
    let model = &loaded.model;
    let first_token_bytes = first_token_bytes(
        &layout,
        &model.token_embd,
        model.config.tied_output,
        &prompt,
        chunk_bytes,
    );
    Ok(Prepared {
        prompt,
        file_len: layout.file_len,
        first_token_bytes,
    })
}

/// Bytes of the loader chunks token 1 needs: every span but the embedding table (header,
/// layers, output norm and head), plus the chunks of the prompt's embedding rows — or the whole
/// table when the output head is tied to it.
fn first_token_bytes(
    layout: &RegionLayout,
    embd: &TensorRef,
    tied_output: bool,
    prompt: &[u32],
    chunk_bytes: u64,
) -> u64 {
    let len = layout.file_len;
    let chunks = len.div_ceil(chunk_bytes) as usize;
    let mut needed = vec![false; chunks];
    let mut mark = |start: u64, end: u64| {
        if start < end && end <= len {
            for c in start / chunk_bytes..=(end - 1) / chunk_bytes {
                needed[c as usize] = true;
            }
        }
    };
    for s in &layout.spans {
        if s.kind != SpanKind::Embedding || tied_output {
            mark(s.start, s.end);
        }
    }
    for &t in prompt {
        let start = (embd.offset + t as usize * embd.row_bytes) as u64;
        mark(start, start + embd.row_bytes as u64);
    }
    needed
        .iter()
        .enumerate()
        .filter(|&(_, &n)| n)
        .map(|(c, _)| chunk_bytes.min(len - c as u64 * chunk_bytes))
        .sum()
}

/// `sync`, then drop the clean page cache (root only).
fn drop_page_cache() -> std::io::Result<()> {
    // Flushing dirty pages lets drop_caches free them too; failure only leaves them cached.
    let _ = std::process::Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "1")
}

/// Reads the whole file once so that it sits in the page cache.
fn warm_page_cache(path: &Path) -> std::io::Result<()> {
    let mut file = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 8 << 20];
    while file.read(&mut buf)? > 0 {}
    Ok(())
}

/// Reads one byte of every base page (faulting the whole mapping in); returns their sum.
fn touch_every_page(bytes: &[u8]) -> u64 {
    let page = airs_memory::page_size().max(1);
    bytes.iter().step_by(page).fold(0u64, |a, &b| {
        a.wrapping_add(u64::from(std::hint::black_box(b)))
    })
}

/// One greedy request on its own scheduler, stepped by hand.
struct Stepped {
    scheduler: Scheduler,
    tokens: Arc<AtomicUsize>,
    failed: Arc<std::sync::Mutex<Option<String>>>,
}

impl Stepped {
    /// A request for `total` tokens after `prompt` on `model` (end-of-generation ignored).
    fn start(
        model: &Arc<LoadedModel>,
        prompt: &[u32],
        total: usize,
        kv_type: KvType,
    ) -> anyhow::Result<Stepped> {
        let config = single_sequence_config(&model.shape, prompt.len() + total, kv_type)?;
        let mut scheduler = Scheduler::new(Arc::clone(model), config, None)?;
        let tokens = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(std::sync::Mutex::new(None));
        let (t, f) = (Arc::clone(&tokens), Arc::clone(&failed));
        let params = GenerationParams {
            max_tokens: total,
            ignore_eos: true,
            ..GenerationParams::default()
        };
        scheduler.submit(
            Request::generate(Prompt::Tokens(prompt.to_vec()), params),
            Box::new(move |event| {
                match event {
                    Event::Token(_) => {
                        t.fetch_add(1, Ordering::Relaxed);
                    }
                    Event::Failed(e) => *f.lock().unwrap() = Some(e.to_string()),
                    _ => {}
                }
                true
            }),
        )?;
        Ok(Stepped {
            scheduler,
            tokens,
            failed,
        })
    }

    /// Step until `n` tokens have been generated.
    fn until(&mut self, n: usize) -> anyhow::Result<()> {
        while self.tokens.load(Ordering::Relaxed) < n {
            if let Some(e) = self.failed.lock().unwrap().take() {
                anyhow::bail!("{e}");
            }
            anyhow::ensure!(
                self.scheduler.has_work(),
                "the request ended after {} tokens",
                self.tokens.load(Ordering::Relaxed)
            );
            self.scheduler.step();
        }
        Ok(())
    }
}

/// Load `path` with `options` into a registry of its own (an unlimited model pool).
fn open(path: &Path, options: &LoadOptions, threads: usize) -> anyhow::Result<Arc<LoadedModel>> {
    let registry = ModelRegistry::new(u64::MAX);
    let model = LoadedModel::load(&registry, path, options, threads)
        .map_err(|e| anyhow::anyhow!("loading {}: {e}", path.display()))?;
    Ok(Arc::new(model))
}

/// Decode steps per burst of the interleaved phase.
fn burst_tokens(args: &BenchLoadArgs) -> usize {
    (args.gen_tokens / 4).max(1)
}

/// KV positions a measurement uses: the prompt, the warm-up, the decode steps, the last token.
fn positions_needed(args: &BenchLoadArgs) -> usize {
    args.prompt_tokens + WARMUP_TOKENS + args.gen_tokens.max(ROUNDS * burst_tokens(args)) + 1
}

/// Interleaved decode: tokens/s of each loader's resident model, bursts alternating.
fn interleaved_decode(
    args: &BenchLoadArgs,
    loaders: &[LoaderKind],
    prompt: &[u32],
    threads: usize,
) -> anyhow::Result<Vec<f64>> {
    let burst = burst_tokens(args);
    let total = 1 + WARMUP_TOKENS + ROUNDS * burst;
    let mut runs = Vec::new();
    for &loader in loaders {
        let model = open(&args.model, &LoadOptions::with_loader(loader), threads)?;
        let region = model.region().context("a model file has a region")?;
        if region.loader_kind() == LoaderKind::Mmap {
            std::hint::black_box(touch_every_page(region.as_bytes()));
        } else {
            model.wait_resident()?;
        }
        let mut run = Stepped::start(&model, prompt, total, args.kv_type)?;
        run.until(1 + WARMUP_TOKENS)?;
        runs.push((model, run, Duration::ZERO));
    }
    for round in 0..ROUNDS {
        for (_, run, spent) in &mut runs {
            let started = Instant::now();
            run.until(1 + WARMUP_TOKENS + (round + 1) * burst)?;
            *spent += started.elapsed();
        }
    }
    Ok(runs
        .iter()
        .map(|(.., spent)| (ROUNDS * burst) as f64 / spent.as_secs_f64().max(1e-9))
        .collect())
}

fn measure(
    args: &BenchLoadArgs,
    loader: LoaderKind,
    prompt: &[u32],
    threads: usize,
    resident_ttft: bool,
) -> anyhow::Result<Measurement> {
    let options = LoadOptions {
        storage_bytes_per_s: args.storage_bytes_per_s(),
        ..LoadOptions::with_loader(loader)
    };
    let path = &args.model;
    let t0 = Instant::now();
    let model = open(path, &options, threads)?;
    let mut run = Stepped::start(
        &model,
        prompt,
        1 + WARMUP_TOKENS + args.gen_tokens,
        args.kv_type,
    )?;
    run.until(1)?;
    let ttft = t0.elapsed();
    let region = Arc::clone(model.region().context("a model file has a region")?);
    let used = region.loader_kind();
    let loaded_at_first_token =
        (used != LoaderKind::Mmap).then(|| region.loader().progress().filled_bytes);

    let fully_resident = if used == LoaderKind::Mmap {
        std::hint::black_box(touch_every_page(region.as_bytes()));
        t0.elapsed()
    } else {
        model
            .wait_resident()
            .with_context(|| format!("loading {}", path.display()))?;
        model
            .fully_resident_after_open()
            .context("a resident region records when it became resident")?
    };

    run.until(1 + WARMUP_TOKENS)?;
    let started = Instant::now();
    run.until(1 + WARMUP_TOKENS + args.gen_tokens)?;
    let decode_time = started.elapsed().as_secs_f64();
    let decode_tokens_per_s = if decode_time > 0.0 {
        args.gen_tokens as f64 / decode_time
    } else {
        0.0
    };
    drop(run);

    let resident_ttft = if resident_ttft {
        let started = Instant::now();
        let mut again = Stepped::start(&model, prompt, 1, args.kv_type)?;
        again.until(1)?;
        Some(started.elapsed())
    } else {
        None
    };
    let stats = region.stats();
    Ok(Measurement {
        used,
        ttft,
        fully_resident,
        decode_tokens_per_s,
        resident_ttft,
        loaded_at_first_token,
        locked_bytes: stats.locked_bytes,
        huge_page_bytes: stats.huge_page_bytes,
        read_only: stats.read_only,
        pinned: stats.pinned,
        notices: region.notices().iter().map(|n| n.to_string()).collect(),
    })
}

/// Medians of one loader's measurements.
struct Summary {
    requested: LoaderKind,
    runs: Vec<Measurement>,
    ttft_s: f64,
    resident_s: f64,
    decode_tps: f64,
    resident_ttft_s: Option<f64>,
    /// From the interleaved decode phase (when more than one loader was measured).
    interleaved_decode_tps: Option<f64>,
}

impl Summary {
    fn new(requested: LoaderKind, runs: Vec<Measurement>) -> Summary {
        let col =
            |f: &dyn Fn(&Measurement) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
        let ttft_s = col(&|m| m.ttft.as_secs_f64());
        let resident_s = col(&|m| m.fully_resident.as_secs_f64());
        let decode_tps = col(&|m| m.decode_tokens_per_s);
        let mut floors: Vec<f64> = runs
            .iter()
            .filter_map(|m| m.resident_ttft.map(|d| d.as_secs_f64()))
            .collect();
        let resident_ttft_s = (!floors.is_empty()).then(|| median(&mut floors));
        Summary {
            requested,
            runs,
            ttft_s,
            resident_s,
            decode_tps,
            resident_ttft_s,
            interleaved_decode_tps: None,
        }
    }

    /// Decode tokens/s to compare loaders by: interleaved when measured, else the median.
    fn decode_for_comparison(&self) -> f64 {
        self.interleaved_decode_tps.unwrap_or(self.decode_tps)
    }

    /// `lazy`, or `lazy→mmap` when the request fell back.
    fn label(&self) -> String {
        let used = self.runs.last().map_or(self.requested, |m| m.used);
        if used == self.requested {
            used.to_string()
        } else {
            format!("{}→{used}", self.requested)
        }
    }
}

pub fn run_load(args: BenchLoadArgs) -> anyhow::Result<()> {
    if let Some(m) = args.storage_mbps {
        anyhow::ensure!(m > 0.0, "--storage-mbps must be positive");
    }
    let chunk_bytes = LoadOptions::default().chunk_bytes as u64;
    let prepared = prepare(&args, chunk_bytes)?;
    let threads = args.threads.unwrap_or_else(default_threads);
    let loaders: Vec<LoaderKind> = match args.loader {
        Some(l) => vec![l],
        None => vec![LoaderKind::Eager, LoaderKind::Mmap, LoaderKind::Lazy],
    };
    let mut notes = Vec::new();
    let mut cold = args.cold;
    if cold && let Err(e) = drop_page_cache() {
        notes.push(format!(
            "--cold needs root to write /proc/sys/vm/drop_caches ({e}): measured with a warm \
             page cache instead"
        ));
        eprintln!("airs: note: {}", notes.last().expect("just pushed"));
        cold = false;
    }
    if args.storage_mbps.is_some() && loaders.contains(&LoaderKind::Mmap) {
        notes.push(
            "mmap is read by the kernel and is not paced by --storage-mbps: its times are those \
             of the real device or page cache"
                .into(),
        );
    }
    let reps = args.reps.max(1);
    let mut runs: Vec<Vec<Measurement>> = vec![Vec::new(); loaders.len()];
    for rep in 0..reps {
        for (i, &loader) in loaders.iter().enumerate() {
            if cold {
                drop_page_cache().context("dropping the page cache")?;
            } else {
                warm_page_cache(&args.model)
                    .with_context(|| format!("reading {}", args.model.display()))?;
            }
            let m = measure(&args, loader, &prepared.prompt, threads, rep == 0)?;
            eprintln!(
                "[{}/{reps}] {loader:>5}: TTFT {:.3} s, fully resident {:.3} s, decode {:.2} \
                 tokens/s{}",
                rep + 1,
                m.ttft.as_secs_f64(),
                m.fully_resident.as_secs_f64(),
                m.decode_tokens_per_s,
                m.resident_ttft
                    .map(|d| format!(", resident TTFT {:.3} s", d.as_secs_f64()))
                    .unwrap_or_default()
            );
            runs[i].push(m);
        }
    }
    let mut summaries: Vec<Summary> = loaders
        .iter()
        .zip(runs)
        .map(|(&l, r)| Summary::new(l, r))
        .collect();
    if loaders.len() > 1 {
        eprintln!("interleaved decode of {} resident models", loaders.len());
        let rates = interleaved_decode(&args, &loaders, &prepared.prompt, threads)?;
        for (s, r) in summaries.iter_mut().zip(rates) {
            s.interleaved_decode_tps = Some(r);
        }
    }
    let limit_s = args
        .storage_bytes_per_s()
        .map(|bps| prepared.first_token_bytes as f64 / bps as f64);
    let eager = summaries.iter().find(|s| s.requested == LoaderKind::Eager);
    let lazy = summaries.iter().find(|s| s.requested == LoaderKind::Lazy);
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    let targets = match (lazy, eager) {
        (Some(l), Some(e)) => Some(json!({
            "lazy_ttft_over_eager": ratio(l.ttft_s, e.ttft_s),
            "lazy_ttft_over_limit": limit_s.map(|lim| ratio(l.ttft_s, lim)),
            "lazy_resident_over_eager": ratio(l.resident_s, e.resident_s),
            "lazy_decode_vs_eager": ratio(l.decode_for_comparison(), e.decode_for_comparison()) - 1.0,
        })),
        _ => None,
    };
    if args.json {
        let loaders_json: Vec<_> = summaries
            .iter()
            .map(|s| {
                let last = s.runs.last();
                json!({
                    "loader": s.requested.as_str(),
                    "loader_used": last.map(|m| m.used.as_str()),
                    "ttft_ms": s.ttft_s * 1e3,
                    "fully_resident_ms": s.resident_s * 1e3,
                    "decode_tokens_per_s": s.decode_tps,
                    "interleaved_decode_tokens_per_s": s.interleaved_decode_tps,
                    "resident_ttft_ms": s.resident_ttft_s.map(|v| v * 1e3),
                    "ttft_ms_all": s.runs.iter().map(|m| m.ttft.as_secs_f64() * 1e3).collect::<Vec<_>>(),
                    "fully_resident_ms_all": s.runs.iter().map(|m| m.fully_resident.as_secs_f64() * 1e3).collect::<Vec<_>>(),
                    "decode_tokens_per_s_all": s.runs.iter().map(|m| m.decode_tokens_per_s).collect::<Vec<_>>(),
                    "loaded_bytes_at_first_token": last.and_then(|m| m.loaded_at_first_token),
                    "locked_bytes": last.map(|m| m.locked_bytes),
                    "huge_page_bytes": last.map(|m| m.huge_page_bytes),
                    "read_only": last.map(|m| m.read_only),
                    "pinned": last.map(|m| m.pinned),
                    "notices": last.map(|m| m.notices.clone()).unwrap_or_default(),
                })
            })
            .collect();
        let report = json!({
            "model": args.model.display().to_string(),
            "file_bytes": prepared.file_len,
            "prompt_tokens": args.prompt_tokens,
            "gen_tokens": args.gen_tokens,
            "reps": reps,
            "threads": threads,
            "kv_type": args.kv_type.name(),
            "storage_mbps": args.storage_mbps,
            "cold": cold,
            "chunk_bytes": chunk_bytes,
            "first_token_bytes": prepared.first_token_bytes,
            "ttft_limit_ms": limit_s.map(|s| s * 1e3),
            "loaders": loaders_json,
            "targets": targets,
            "notes": notes,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "{}: {:.1} MB, prompt {} tokens, {} threads, storage {}, page cache {}",
        args.model.display(),
        prepared.file_len as f64 / 1e6,
        args.prompt_tokens,
        threads,
        args.storage_mbps
            .map_or("unpaced".to_string(), |m| format!("{m} MB/s")),
        if cold { "cold" } else { "warm" }
    );
    print!(
        "token 1 needs {:.1} MB ({:.0}% of the file, in {} KiB chunks)",
        prepared.first_token_bytes as f64 / 1e6,
        100.0 * prepared.first_token_bytes as f64 / prepared.file_len as f64,
        chunk_bytes >> 10
    );
    match limit_s {
        Some(l) => println!(": TTFT limit {l:.2} s"),
        None => println!(),
    }
    println!(
        "{:<10} {:>9} {:>9} {:>12} {:>11} {:>12} {:>13} {:>9}",
        "loader",
        "TTFT s",
        "÷ eager",
        "resident s",
        "decode t/s",
        "A/B decode",
        "resident TTFT",
        "median of"
    );
    let eager_ttft = eager.map(|e| e.ttft_s);
    for s in &summaries {
        println!(
            "{:<10} {:>9.3} {:>9} {:>12.3} {:>11.2} {:>12} {:>13} {:>9}",
            s.label(),
            s.ttft_s,
            eager_ttft.map_or("-".into(), |e| format!("{:.2}", ratio(s.ttft_s, e))),
            s.resident_s,
            s.decode_tps,
            s.interleaved_decode_tps
                .map_or("-".into(), |v| format!("{v:.2}")),
            s.resident_ttft_s
                .map_or("-".into(), |v| format!("{v:.3} s")),
            s.runs.len()
        );
        if let Some(n) = s.runs.last().map(|m| &m.notices)
            && !n.is_empty()
        {
            for line in n {
                println!("           note: {line}");
            }
        }
    }
    if let (Some(l), Some(e)) = (lazy, eager) {
        print!(
            "lazy vs eager: TTFT ×{:.2} (target ≤ 0.70), fully resident ×{:.2} (≤ 1.10), \
             decode {:+.1}% (within ±3%)",
            ratio(l.ttft_s, e.ttft_s),
            ratio(l.resident_s, e.resident_s),
            100.0 * (ratio(l.decode_for_comparison(), e.decode_for_comparison()) - 1.0)
        );
        match limit_s {
            Some(lim) => println!(", TTFT ×{:.2} the limit (≤ 1.10)", ratio(l.ttft_s, lim)),
            None => println!(),
        }
    }
    for n in &notes {
        println!("note: {n}");
    }
    Ok(())
}
